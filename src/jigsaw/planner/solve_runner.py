"""CBC solves in a warm child process: a native abort inside CBC ends the child, not the caller.

Why: CBC (through python-mip) has died of SIGABRT inside ``Cbc_solve`` -> ``CbcSolver::postprocess``
about once in five runs of the node-plan bench, and of SIGSEGV under load; in the caller's process
that ended ``jigsaw plan``, ``jigsaw capacity``, the benches and the test suite. Here each CBC solve
of a ``model.LinearModel`` goes to a child process (started once, reused: the interpreter and
python-mip load once, about 0.2 s), and a child that dies or overruns its hard limit is a
``SolverCrash``, which ``model.LinearModel.solve`` answers by solving the same model on HiGHS in
the caller (the other solver: a crash becomes a retry, named in the solution's ``crash``).

Protocol, both ways one JSON header line followed by raw little-endian arrays (never pickle)::

    -> {"n": VARS, "m": ROWS, "nnz": NONZEROS, "starts": K, "maximize": bool, "time_limit_s": T,
        "absolute_gap": G, "relative_gap": R, "max_nodes": N|null, "cuts": bool}
       then float64 col_lo[n] col_hi[n] cost[n] row_lo[m] row_hi[m] value[nnz] start_value[K],
       int32 row_len[m] index[nnz] start_index[K], uint8 integer[n]
    <- {"status": S, "objective": X, "bound": B, "seconds": T, "nodes": N, "dual_bound": D,
        "values": K} then float64 values[K]      |  {"error": MESSAGE}

    python -m jigsaw.planner.solve_runner
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from jigsaw.planner.cbc import Arrays
from jigsaw.planner.solution import Solution

FAULT_ENV = "JIGSAW_CBC_FAULT"  # abort | hang: the child does so in its next solve (tests inject it)
GRACE_S = 10.0  # beyond twice the solve's limit before the child is killed as hung
_MAX_HEADER_BYTES = 1 << 16
_F8, _I4, _U1 = np.dtype("<f8"), np.dtype("<i4"), np.dtype("u1")


class SolverCrash(RuntimeError):
    """The CBC child process died or hung during a solve (it is replaced at the next solve)."""


def _encode(model: Arrays, time_limit_s: float, absolute_gap: float,
            start: dict[int, float] | None, relative_gap: float, max_nodes: int | None,
            cuts: bool = True) -> bytes:
    keys = sorted(start) if start else []
    lens = [len(idx) for idx in model.row_index]
    head = {"n": len(model.cost), "m": len(model.row_lo), "nnz": sum(lens), "starts": len(keys),
            "maximize": model.maximize, "time_limit_s": time_limit_s, "absolute_gap": absolute_gap,
            "relative_gap": relative_gap, "max_nodes": max_nodes, "cuts": cuts}
    floats = np.concatenate([np.asarray(a, dtype=_F8) for a in (
        model.col_lo, model.col_hi, model.cost, model.row_lo, model.row_hi,
        [v for val in model.row_value for v in val], [start[k] for k in keys] if start else [])])
    ints = np.asarray(lens + [i for idx in model.row_index for i in idx] + keys, dtype=_I4)
    return (json.dumps(head).encode() + b"\n" + floats.tobytes() + ints.tobytes()
            + np.asarray(model.integer, dtype=_U1).tobytes())


def _payload_bytes(head: dict[str, Any]) -> int:
    n, m, nnz, k = head["n"], head["m"], head["nnz"], head["starts"]
    return 8 * (3 * n + 2 * m + nnz + k) + 4 * (m + nnz + k) + n


def _decode(head: dict[str, Any], data: bytes) -> tuple[Arrays, dict[int, float] | None]:
    n, m, nnz, k = head["n"], head["m"], head["nnz"], head["starts"]
    nf, ni = 3 * n + 2 * m + nnz + k, m + nnz + k
    f = np.frombuffer(data, dtype=_F8, count=nf)
    i = np.frombuffer(data, dtype=_I4, count=ni, offset=8 * nf)
    integ = np.frombuffer(data, dtype=_U1, count=n, offset=8 * nf + 4 * ni)
    cuts = np.cumsum([n, n, n, m, m, nnz])
    col_lo, col_hi, cost, row_lo, row_hi, value, start_value = np.split(f, cuts)
    row_len, index, start_index = np.split(i, [m, m + nnz])
    bounds = np.concatenate([[0], np.cumsum(row_len)]).tolist()
    idx_l, val_l = index.tolist(), value.tolist()
    model = Arrays(bool(head["maximize"]), col_lo.tolist(), col_hi.tolist(), cost.tolist(),
                   [bool(b) for b in integ], row_lo.tolist(), row_hi.tolist(),
                   [idx_l[bounds[r]:bounds[r + 1]] for r in range(m)],
                   [val_l[bounds[r]:bounds[r + 1]] for r in range(m)])
    start = dict(zip(start_index.tolist(), start_value.tolist(), strict=True)) if k else None
    return model, start


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("the stream ended inside a frame")
    return data


class _Child:
    """One warm CBC child process and its pipes."""

    def __init__(self) -> None:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # this checkout's jigsaw, not an installed one
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "jigsaw.planner.solve_runner"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def solve(self, frame: bytes, hard_limit_s: float) -> tuple[dict[str, Any], list[float]]:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(hard_limit_s, expire)
        timer.daemon = True
        timer.start()
        try:
            proc.stdin.write(frame)
            proc.stdin.flush()
            line = proc.stdout.readline(_MAX_HEADER_BYTES)
            if not line:
                raise EOFError
            head = json.loads(line)
            k = int(head.get("values", 0))
            values = np.frombuffer(_read_exact(proc.stdout, 8 * k), dtype=_F8).tolist() if k else []
        except (OSError, EOFError, ValueError):
            self.close()
            raise SolverCrash(_why(proc, expired.is_set(), hard_limit_s)) from None
        finally:
            timer.cancel()
        return head, values

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        proc = self.proc
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _why(proc: subprocess.Popen[bytes], expired: bool, hard_limit_s: float) -> str:
    if expired:
        return f"CBC solve hung past {hard_limit_s:g} s (its process was killed)"
    try:
        rc = proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        return "CBC's process stopped answering"
    if rc < 0:
        import signal

        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"CBC's process died of {name}"
    return f"CBC's process exited with status {rc}"


_IDLE: list[_Child] = []  # warm children not in a solve (one per concurrent solver thread at most)
_POOL_LOCK = threading.Lock()


def _take() -> _Child:
    with _POOL_LOCK:
        while _IDLE:
            child = _IDLE.pop()
            if child.alive():
                return child
            child.close()
    return _Child()


def _give(child: _Child) -> None:
    with _POOL_LOCK:
        _IDLE.append(child)


def shutdown() -> None:
    """End the warm children (at exit; tests call it so that a new child sees a new environment)."""
    with _POOL_LOCK:
        children = list(_IDLE)
        _IDLE.clear()
    for child in children:
        child.close()


atexit.register(shutdown)
# a forked process (the solver process's precompute steps) starts its own children: the pipes of
# its parent's warm ones are the parent's, and a frame written to them from both sides corrupts both
os.register_at_fork(after_in_child=_IDLE.clear)


def solve_cbc(model: Arrays, time_limit_s: float, absolute_gap: float,
              start: dict[int, float] | None, relative_gap: float = 0.0,
              max_nodes: int | None = None, cuts: bool = True) -> Solution:
    """``model`` solved by CBC in a warm child process (``cuts``: ``cbc.solve``'s). Raises
    ``SolverCrash`` when the child dies (a native abort) or overruns twice the limit plus
    ``GRACE_S``; the next call starts a new child."""
    frame = _encode(model, time_limit_s, absolute_gap, start, relative_gap, max_nodes, cuts)
    child = _take()
    head, values = child.solve(frame, 2.0 * time_limit_s + GRACE_S)
    _give(child)
    if "error" in head:
        raise SolverCrash(f"CBC's process failed: {head['error']}")
    return Solution(str(head["status"]), values, float(head["objective"]), float(head["bound"]),
                    float(head["seconds"]), int(head["nodes"]), float(head["dual_bound"]))


def _serve(inp: IO[bytes], out: IO[bytes]) -> int:
    from jigsaw.planner import cbc

    while True:
        line = inp.readline(_MAX_HEADER_BYTES)
        if not line:
            return 0
        head = json.loads(line)
        model, start = _decode(head, _read_exact(inp, _payload_bytes(head)))
        fault = os.environ.get(FAULT_ENV)
        if fault == "abort":
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an injected crash leaves no core file
            os.abort()
        if fault == "hang":
            time.sleep(3600.0)
        try:
            sol = cbc.solve(model, float(head["time_limit_s"]), float(head["absolute_gap"]), start,
                             float(head["relative_gap"]), head["max_nodes"], bool(head.get("cuts", True)))
        except Exception as exc:  # answered: the caller retries on HiGHS
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
            out.flush()
            continue
        doc = {"status": sol.status, "objective": sol.objective, "bound": sol.bound,
               "seconds": sol.seconds, "nodes": sol.nodes, "dual_bound": sol.dual_bound,
               "values": len(sol.values)}
        out.write(json.dumps(doc).encode() + b"\n" + np.asarray(sol.values, dtype=_F8).tobytes())
        out.flush()


def main() -> int:
    # the protocol keeps descriptor 1 to itself: whatever CBC prints goes to standard error
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    sys.exit(main())
