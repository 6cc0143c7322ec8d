"""Reconfigurations of a running ``jigsawd --emulate`` over a replayed day: what each one keeps,
starts and stops, and what it costs the traffic.

    PYTHONPATH=src python bench/reconfig.py [--node examples/h100x4.toml] [--bins 12] [--first-bin 96]
        [--peaks social_media=120,traffic_analysis=60,ar_assistant=30] [--time-limit 3]
        [--app traffic_analysis] [--rewire N]

One app (``--app``) of the node is served under closed-loop traffic; each bin's demand (a
synthetic diurnal day, 5-minute bins, scaled to the app's ``--peaks``) is pushed with ``POST
/admin/control`` and the row says how it was applied (in place: ``re-weight``; a new routing
generation: ``new-gen``), the worker processes kept (same pid), started and stopped
(``/admin/layout`` ``processes``), the MIG instances created / destroyed and the GPUs NVML was
called on (the emulated NVML's call log), the time from plan decided to routing switched
(``/admin/layout`` ``applied``), the wall time of the request (solve included) and the requests
lost during it (not answered, or answered 5xx). The daemon's own reconfiguration path
(``runtime/generations.py``) is what runs: there is no second engine. New processes run on spare
workers (``server.spare_workers``) where ready; with ``control.repartition_delay_s`` at 0 the
switch time of a re-plan that starts processes is what starting them costs.

``--rewire N``: N re-plans that keep every instance but still need a new routing generation
(another planned task latency, which the workers' batching reads), through the daemon's generation
manager with real worker processes: the time from plan decided to routing switched (every kept
process told by SIGHUP to serve the new rings, and ready in them).

Times are wall clock on the machine that runs it (shared and small here: compare ratios from one
run).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "src"))


from jigsaw.node import load_node, load_node_profiles  # noqa: E402
from jigsaw.planner.milp import plan  # noqa: E402
from jigsaw.traces import bin_rates, scale_to_peak, synthetic_day  # noqa: E402


def _peaks(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = float(value)
    return out


# ---- live: through a running jigsawd under traffic ---------------------------------------------
def _http(method: str, url: str, body: object = None, timeout_s: float = 120.0) -> object:
    import json
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read().decode())


class _Load:
    """Closed-loop clients; counts sent, answered by status, and no answer (-1)."""

    def __init__(self, url: str, app: str, threads: int = 4) -> None:
        import threading
        import urllib.error
        import urllib.request

        sys.path.append(str(ROOT / "bench"))
        from replay import request_body

        body, headers = request_body(_http("GET", f"{url}/v2/models/{app}"))  # type: ignore[arg-type]
        self.sent = 0
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

        def run() -> None:
            while not self.stop.is_set():
                with self.lock:
                    self.sent += 1
                req = urllib.request.Request(f"{url}/v2/models/{app}/infer", data=body, method="POST",
                                             headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        r.read()
                        status = r.status
                except urllib.error.HTTPError as e:
                    status = e.code
                except OSError:
                    status = -1
                with self.lock:
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                time.sleep(0.005)

        self.threads = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def failed(self) -> int:
        """Answered 5xx or not at all (so far; requests in flight are not counted)."""
        with self.lock:
            return sum(n for s, n in self.statuses.items() if s < 0 or s >= 500)

    def lost(self) -> int:
        """Failed, plus sent and never answered (once the clients have stopped)."""
        with self.lock:
            answered = sum(self.statuses.values())
        return self.failed() + (self.sent - answered)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def _serving(layout: dict, app: str, gen: int) -> set[int]:
    return {p["pid"] for p in layout["processes"] if p["app"] == app and gen in p["generations"]}


def live(args: argparse.Namespace) -> int:
    from jigsaw.testing import jigsawd

    peaks = _peaks(args.peaks)
    day = bin_rates(synthetic_day(args.seed), 300)
    window = scale_to_peak(day[args.first_bin: args.first_bin + args.bins], peaks.get(args.app, 60.0))
    app = args.app
    with tempfile.TemporaryDirectory(prefix="jigsaw-bench-") as tmp:
        server = jigsawd(["--node-config", args.node, "--apps", app, "--demand", f"{window[0]:g}",
                          "--bin-seconds", "3600", "--plan-time-limit", f"{args.time_limit:g}"],
                         Path(tmp) / "jigsawd.log", cwd=ROOT, ready_timeout_s=150)
        server.start()
        url = f"http://127.0.0.1:{server.port}"
        load = _Load(url, app)
        rows = []
        try:
            print(f"jigsawd --emulate, app {app}, {len(window)} re-plans (each bin twice: the second keeps "
                  "every instance); closed-loop traffic throughout")
            print(f"{'step':>4} {'rps':>6} {'how':>9} {'kept':>5} {'started':>7} {'stopped':>7} {'mig+':>5} "
                  f"{'mig-':>5} {'nvml_gpus':>9} {'switch_ms':>10} {'request_ms':>10} {'lost':>5}")
            for k, rps in enumerate(x for r in window for x in (r, r)):
                before = _http("GET", f"{url}/admin/layout")
                gen0 = _http("GET", f"{url}/admin/plan")[app]["generation"]  # type: ignore[index]
                old = _serving(before, app, gen0)  # type: ignore[arg-type]
                ev0 = len(before["mig"]["events"])  # type: ignore[index]
                calls0 = len(before["mig"]["calls"] or [])  # type: ignore[index]
                lost0 = load.failed()
                t0 = time.monotonic()
                done = _http("POST", f"{url}/admin/control", {"app": app, "replan_rps": rps})
                took = time.monotonic() - t0
                gen = done["generation"]  # type: ignore[index]
                mid = _http("GET", f"{url}/admin/layout")
                new = _serving(mid, app, gen)  # type: ignore[arg-type]
                applied = mid["applied"][-1]  # type: ignore[index]
                deadline = time.monotonic() + 30  # the old processes drain and stop, MIG follows
                while gen != gen0 and time.monotonic() < deadline:
                    after = _http("GET", f"{url}/admin/layout")
                    if all(p["generations"] == [gen] for p in after["processes"]):  # type: ignore[index]
                        break
                    time.sleep(0.1)
                time.sleep(0.2)
                after = _http("GET", f"{url}/admin/layout")
                events = after["mig"]["events"][ev0:]  # type: ignore[index]
                calls = (after["mig"]["calls"] or [])[calls0:]  # type: ignore[index]
                made = sum(len(e.get("created", [])) for e in events)
                gone = sum(len(e.get("destroyed", [])) for e in events)
                how = "new-gen" if gen != gen0 else ("re-weight" if applied["error"] is None else "failed")
                kept, started, stopped = len(old & new), len(new - old), len(old - new)
                lost = load.failed() - lost0
                gpus = ",".join(str(g) for g in sorted({c[1] for c in calls if c[1] is not None})) or "-"
                rows.append((how, kept, started, stopped, applied["seconds"], took, lost, len(new)))
                print(f"{k:>4} {rps:>6.1f} {how:>9} {kept:>5} {started:>7} {stopped:>7} {made:>5} {gone:>5} "
                      f"{gpus:>9} {applied['seconds'] * 1e3:>10.1f} {took * 1e3:>10.1f} {lost:>5}")
            time.sleep(2.0)
            import re
            import urllib.request
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
                metrics = r.read().decode()
            used = re.search(r"^jigsaw_spare_workers_used_total (\S+)$", metrics, re.M)
        finally:
            load.close()
            server.stop()
            server.close()
    print()
    print(f"requests sent {load.sent}, answered {sum(load.statuses.values())}, statuses {load.statuses}; "
          f"lost {load.lost()} (target 0)")
    same = [r for r in rows if r[2] == 0]
    if same:
        print(f"re-plans that kept every instance: {len(same)}; plan decided -> routing switched ms: median "
              f"{statistics.median(r[4] for r in same) * 1e3:.1f}, max {max(r[4] for r in same) * 1e3:.1f} "
              "(target <= 50)")
    gens = [r for r in rows if r[0] == "new-gen"]
    if gens:
        print(f"re-plans with new processes: {len(gens)}; processes started {sum(r[2] for r in gens)}, kept "
              f"{sum(r[1] for r in gens)}, stopped {sum(r[3] for r in gens)} (a whole new generation would "
              f"start {sum(r[7] for r in gens)}); decided -> switched ms median "
              f"{statistics.median(r[4] for r in gens) * 1e3:.1f}; run by spare workers "
              f"{used.group(1) if used else 'n/a (server.spare_workers = 0)'}")
    return 0 if load.lost() == 0 else 1


def rewire(args: argparse.Namespace) -> int:
    """Keep-all re-plans that still need a new routing generation (same instances, another planned
    task latency): the daemon's generation manager on the emulated node, real worker processes,
    no process started; prints plan decided -> routing switched per re-plan."""
    import dataclasses

    from jigsaw.backends.registry import backend_kind
    from jigsaw.control.transition import MakeRoom, transit
    from jigsaw.runtime.frontend import Frontend
    from jigsaw.runtime.generations import DesiredState, GenerationManager

    node = load_node(args.node)
    app = next(a for a in node.apps if a.name == args.app)
    profiles = load_node_profiles(node, [app])
    first = plan(app, node, profiles, demand_rps=_peaks(args.peaks).get(app.name, 60.0),
                 time_limit_s=args.time_limit, solver="highs")
    slower = dataclasses.replace(first, task_latency_ms={t: 1.5 * ms
                                                         for t, ms in first.task_latency_ms.items()})
    gm = GenerationManager(node, [(app, first)], time_scale=1.0, seed=0, backend=backend_kind("emulated"),
                           log=lambda line: None)
    fe = Frontend(gm.backend, hop_latency_ms=node.planner.hop_latency_ms)
    rows: list[tuple[float, int, int]] = []
    try:
        gm.start_all()

        async def go() -> None:
            gm.attach(fe)
            fe.start(asyncio.get_running_loop())
            try:
                for k in range(args.rewire):
                    done, _ = await transit(gm, DesiredState(app.name, slower if k % 2 == 0 else first),
                                            MakeRoom(node.control.drain_wait_slo))
                    rows.append((done.seconds, done.kept, done.started))
                    while len(gm.generations) > 1:  # the old routing generation retires
                        await asyncio.sleep(0.05)
            finally:
                fe.close()

        asyncio.run(go())
    finally:
        gm.close()
    print(f"{app.name}: {len(rows)} keep-all re-plans with a new routing generation on the emulated node")
    print(f"{'step':>4} {'kept':>5} {'started':>7} {'switch_ms':>10}")
    for k, (sec, kept, started) in enumerate(rows):
        print(f"{k:>4} {kept:>5} {started:>7} {sec * 1e3:>10.1f}")
    ms = [r[0] * 1e3 for r in rows]
    print(f"plan decided -> routing switched ms: median {statistics.median(ms):.1f}, max {max(ms):.1f} "
          f"(target <= 50); processes started {sum(r[2] for r in rows)} (target 0)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default=str(ROOT / "examples" / "h100x4.toml"))
    p.add_argument("--bins", type=int, default=12)
    p.add_argument("--first-bin", type=int, default=96, help="first 5-minute bin of the synthetic day")
    p.add_argument("--peaks", default="social_media=120,traffic_analysis=60,ar_assistant=30",
                   help="peak demand (root requests/s) of each app over the window")
    p.add_argument("--time-limit", type=float, default=3.0, help="planner time limit per solve (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--live", action="store_true", help="(the default; kept for old command lines)")
    p.add_argument("--app", default="traffic_analysis", help="the app re-planned")
    p.add_argument("--rewire", type=int, default=0, metavar="N",
                   help="N keep-all re-plans that need a new routing generation (no process started)")
    args = p.parse_args()
    if args.rewire:
        return rewire(args)
    return live(args)


if __name__ == "__main__":
    sys.exit(main())
