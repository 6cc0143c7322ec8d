"""Worker start-up: N processes started at once through the fork server vs. one Python start each.

A re-plan that starts processes waits for all of them; this bench starts ``--workers`` worker
processes at once, each as a spare (``python -m jigsaw.runtime.worker --spare``: the
interpreter, the worker's imports, its signal handlers; the spec's own loading is the same on
both paths and not counted), and times until every one has said it is ready (its
``<control>.ready`` file), then stops them. Rounds alternate between the two paths
(``subprocess.Popen`` and ``runtime/forkserver.py``); it prints each round, the median wall time
per path, the CPU seconds the started processes used until ready, and the ratio.

    PYTHONPATH=src python bench/spawn.py --workers 29 --rounds 3

On a GPU node a worker also creates its CUDA context and loads its engines after it starts: a
fork does not skip that part, so the ratio there is smaller than this one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jigsaw.runtime.forkserver import ForkServer, WorkerProcess, launch

TIMEOUT_S = 300.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(n: int, server: ForkServer | None, where: Path) -> tuple[float, float]:
    """Start ``n`` spares at once and wait until all are ready: (wall seconds, CPU seconds)."""
    controls = [where / f"spare-{i}.json" for i in range(n)]
    procs: list[WorkerProcess] = []
    t0 = time.perf_counter()
    try:
        for c in controls:
            procs.append(launch(server, ["--spare", "--control", str(c)]))
        waiting = set(range(n))
        deadline = time.monotonic() + TIMEOUT_S
        while waiting:
            waiting = {i for i in waiting if not controls[i].with_suffix(".ready").exists()}
            for i in waiting:
                if procs[i].poll() is not None:
                    raise SystemExit(f"worker {procs[i].pid} exited with status {procs[i].returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(waiting)} workers not ready after {TIMEOUT_S:g} s")
            time.sleep(0.001)
        wall_s = time.perf_counter() - t0
        cpu_s = sum(_cpu_s(p.pid) for p in procs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except Exception:
                p.kill()
                p.wait()
        for c in controls:
            c.with_suffix(".ready").unlink(missing_ok=True)
    return wall_s, cpu_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=29, help="processes started at once (default 29)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path, alternating (default 3)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rounds < 1:
        parser.error("--workers and --rounds must be >= 1")
    server = ForkServer(log=lambda line: print(line, file=sys.stderr))
    t0 = time.perf_counter()
    if not server.start():
        raise SystemExit("the fork server did not get ready")
    print(f"fork server ready in {time.perf_counter() - t0:.2f} s (its imports, once, at the daemon's start)")
    walls: dict[str, list[float]] = {"popen": [], "fork": []}
    cpus: dict[str, list[float]] = {"popen": [], "fork": []}
    try:
        with tempfile.TemporaryDirectory(prefix="jigsaw-spawn-") as tmp:
            for r in range(args.rounds):
                for path in ("popen", "fork"):
                    wall, cpu = one_round(args.workers, server if path == "fork" else None, Path(tmp))
                    walls[path].append(wall)
                    cpus[path].append(cpu)
                    print(f"round {r + 1} {path:5s}: {args.workers} workers ready in {wall:.3f} s, "
                          f"{cpu:.2f} CPU s")
        forks, fallbacks = server.forks_total, server.fallbacks_total
    finally:
        server.close()
    if fallbacks:
        raise SystemExit(f"{fallbacks} processes fell back to Popen: the fork path was not measured")
    popen, fork = statistics.median(walls["popen"]), statistics.median(walls["fork"])
    print(f"host CPUs: {os.cpu_count()}; {forks} forks")
    print(f"median wall: popen {popen:.3f} s, fork server {fork:.3f} s; "
          f"median CPU: popen {statistics.median(cpus['popen']):.2f} s, "
          f"fork server {statistics.median(cpus['fork']):.2f} s")
    print(f"ratio popen / fork server (wall, {args.workers} workers): {popen / fork:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
