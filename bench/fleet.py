"""A fleet on this machine: N emulated jigsawd nodes behind a real nginx, a trace window replayed.

Starts one ``jigsawd --emulate`` per node of the fleet file on loopback ports (controller on:
each node re-plans every bin for the demand nginx sends it), renders the fleet plan's nginx
configuration (per-app ``upstream`` with the plan's weights) and starts nginx through
``scripts/nginx.sh`` (the Debian package, installed if missing). The window of the trace,
scaled so that its peak is ``--load`` x the fleet's capacity, is replayed through nginx
(open-loop Poisson arrivals). At the end of every bin the fleet plan is recomputed for the
next bin's demand and nginx reloaded gracefully with the new weights; a node whose share moved
is told to re-plan at once (``POST /admin/control``). With ``--kill NODE@BIN`` that node is
killed (SIGKILL, its whole process group) half-way through the bin: nginx stops sending to it
(a refused connection goes to the next node) and the next fleet plan spreads its share over
the others. nginx adds the answering node to every response, so every answer is attributed:

- per node and in total: slices used (mean over bins, from each node's bin history),
  sent (answers it gave) and violations (its 503/504 answers), and in total sent == answered;
- failed: answers that are neither 200 nor an SLO violation (nginx's 502 when a node died
  with the request in flight), split into those on the killed node and the rest ("lost
  outside"; the target is 0).

``--baseline`` also runs one node directly (no nginx) at the fleet's per-node load and prints
the violation difference (target: within 0.5 percentage points at 70% of capacity).

    python bench/fleet.py [--fleet examples/fleet.toml] [--load 0.7] [--bins 150:160]
        [--bin-seconds 6] [--time-scale 40] [--kill h100-2@4] [--baseline] [--out out/fleet]

Emulated nodes and modeled profiles: the latencies are the emulator's, not measured on GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import jigsaw  # noqa: F401
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

from replay import http_json, poisson_times, request_body  # noqa: E402

from jigsaw.errors import JigsawError  # noqa: E402
from jigsaw.fleet.config import Fleet, load_fleet  # noqa: E402
from jigsaw.fleet.planner import FleetCurves, FleetPlan, fleet_capacity, plan_fleet  # noqa: E402
from jigsaw.fleet.render import render_nginx  # noqa: E402
from jigsaw.testing import ServerProcess, free_port, jigsawd  # noqa: E402
from jigsaw.traces import TraceError, day_bins, parse_bins, parse_trace_spec  # noqa: E402

NGINX_SH = ROOT / "scripts" / "nginx.sh"
# In flight = rate x latency in node time, whatever the time scale: about 2000 for three nodes
# at 70% of traffic analysis's capacity. A client capped lower falls behind its schedule.
MAX_CONCURRENCY = 4096
TAIL_TIMEOUT_S = 60.0
SHARE_MOVE = 0.10  # a node whose share moved by more than this re-plans at once


def log(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


class Nginx:
    """nginx on a private folder through the project's script; stopped (gracefully) on exit."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.reloads = 0

    def write(self, plan: FleetPlan, addresses: dict[str, str]) -> None:
        conf = render_nginx(plan, addresses, listen=f"127.0.0.1:{self.port}", prefix=str(self.dir))
        tmp = self.dir / "nginx.conf.tmp"
        tmp.write_text(conf)
        tmp.replace(self.dir / "nginx.conf")

    def _run(self, cmd: str) -> None:
        r = subprocess.run([str(NGINX_SH), cmd, str(self.dir)], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/nginx.sh {cmd} failed ({r.returncode}): {r.stderr.strip()}")

    def start(self) -> None:
        self._run("start")
        deadline = time.monotonic() + 10
        while not (self.dir / "nginx.pid").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start; see {self.dir}/error.log")
            time.sleep(0.05)

    def reload(self) -> None:
        self._run("reload")
        self.reloads += 1

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run("stop")


@dataclass
class Tally:
    sent: int = 0  # answers this node (or the total) gave
    ok: int = 0
    violations: int = 0  # 503 / 504: the node answered, outside the SLO
    failed: int = 0  # anything else: 502 from nginx (node died mid-request), connection errors
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    sent: int = 0
    answered: int = 0
    per_node: dict[str, Tally] = field(default_factory=dict)
    total: Tally = field(default_factory=Tally)
    unattributed_failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # "status upstream" -> count
    behind_s: float = 0.0
    replans: list[dict[str, Any]] = field(default_factory=list)


async def play(url: str, app: str, window: list[float], bin_seconds: float, time_scale: float,
               seed: int, addr_to_node: dict[str, str], on_bin_end: Any) -> RunResult:
    """Open-loop Poisson arrivals through nginx; ``on_bin_end(k)`` runs in a thread between bins."""
    import aiohttp
    rng = random.Random(seed)
    res = RunResult()
    model = http_json("GET", f"{url}/v2/models/{app}")
    body, headers = request_body(model)
    infer = f"{url}/v2/models/{app}/infer"
    sem = asyncio.Semaphore(MAX_CONCURRENCY)
    tasks: set[asyncio.Task[None]] = set()
    # A new connection per request: a keep-alive connection nginx closes on a graceful reload
    # would race a request sent on it (the client's problem, not a dropped request).
    conn = aiohttp.TCPConnector(limit=MAX_CONCURRENCY, force_close=True)

    def node_of(upstream: str) -> str | None:
        last = upstream.split(",")[-1].strip() if upstream else ""
        return addr_to_node.get(last)

    async def one(session: aiohttp.ClientSession) -> None:
        t0 = time.monotonic()
        status, upstream = 0, ""
        try:
            async with session.post(infer, data=body, headers=headers) as resp:
                await resp.read()
                status, upstream = resp.status, resp.headers.get("X-Jigsaw-Upstream", "")
        except (TimeoutError, aiohttp.ClientError):
            status = 0
        finally:
            sem.release()
        res.answered += 1
        node = node_of(upstream)
        tallies = [res.total] + ([res.per_node.setdefault(node, Tally())] if node else [])
        for t in tallies:
            t.sent += 1
            if status == 200:
                t.ok += 1
                t.latencies_ms.append((time.monotonic() - t0) * 1000.0 / time_scale)
            elif status in (503, 504):
                t.violations += 1
            else:
                t.failed += 1
        if status not in (200, 503, 504):
            key = f"{status} {upstream or '-'}"
            res.failures[key] = res.failures.get(key, 0) + 1
            if node is None:
                res.unattributed_failed += 1

    timeout = aiohttp.ClientTimeout(total=TAIL_TIMEOUT_S)
    replan: asyncio.Future[None] | None = None
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.monotonic()
        for k, rate in enumerate(window):
            bin_start = start + k * bin_seconds
            for off in poisson_times(rate / time_scale, bin_seconds, rng):
                due = bin_start + off
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                await sem.acquire()
                res.behind_s = max(res.behind_s, time.monotonic() - due)
                res.sent += 1
                t = asyncio.get_running_loop().create_task(one(session))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            end = bin_start + bin_seconds
            if end > time.monotonic():
                await asyncio.sleep(end - time.monotonic())
            # the next bin's plan is made while its arrivals flow; one re-plan at a time
            if replan is not None and not replan.done():
                log(f"bin {k}: the previous fleet re-plan is still running; skipping this one")
            elif k + 1 < len(window):
                replan = asyncio.get_running_loop().run_in_executor(None, on_bin_end, k)
        if replan is not None:
            await replan
        if tasks:
            await asyncio.wait(set(tasks), timeout=TAIL_TIMEOUT_S + 5)
    return res


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def node_file_for_bench(source: str, solver: str, folder: Path) -> str:
    """A copy of a node file whose planner uses ``solver`` (paths made absolute).

    The nodes' controllers re-plan within 0.4 x the bin; on two shared cores CBC often finds
    no traffic-analysis plan that fast where HiGHS does (README: bench/capacity.py says the same).
    """
    import tomllib
    src = Path(source)
    doc = tomllib.loads(src.read_text())
    doc["apps"] = [str((src.parent / a).resolve()) for a in doc.get("apps", [])]
    gpus = doc.setdefault("gpus", {})
    gpus["profiles_dir"] = str((src.parent / gpus.get("profiles_dir", "../profiles/"
                                                      + str(gpus.get("model", "")).lower())).resolve())
    doc.setdefault("planner", {})["solver"] = solver
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    out = folder / src.name
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def fleet_node_plans(fleet: Fleet, app: str, window: list[float], curves: FleetCurves,
                     slack: float) -> dict[str, str]:
    """Each node's plan file for the window's peak demand (+ slack): what ``k8s render`` mounts."""
    from jigsaw.fleet.render import node_plan_json
    fp, _ = plan_fleet(fleet.with_demand({app: max(window) * slack}), curves=curves)
    for note in fp.notes:
        log(f"fleet plan: {note}")
    return {n.name: node_plan_json(n) for n in fp.nodes}


def window_for(fleet: Fleet, app: str, capacity_rps: float, args: argparse.Namespace) -> list[float]:
    spec = parse_trace_spec(args.trace)
    bins = day_bins(spec, day=args.day)
    a, b = parse_bins(args.bins, len(bins))
    window = bins[a:b]
    peak = max(window) or 1.0
    return [r / peak * args.load * capacity_rps for r in window]


def run_fleet(fleet: Fleet, app: str, window: list[float], curves: FleetCurves, args: argparse.Namespace,
              out: Path, kill: tuple[str, int] | None) -> tuple[RunResult, dict[str, list[dict[str, Any]]]]:
    node_names = [n for g in fleet.groups for n in g.node_names()]
    slack = 1 + max(g.node.planner.demand_slack for g in fleet.groups)
    plan0, curves = plan_fleet(fleet.with_demand({app: window[0]}), curves=curves, plan_nodes=False)
    node_plans = fleet_node_plans(fleet, app, window, curves, slack) if args.node_control == "fleet" else {}
    state: dict[str, Any] = {"plan": plan0, "down": set()}
    daemons: dict[str, ServerProcess] = {}
    nginx = Nginx(Path(tempfile.mkdtemp(prefix="jigsaw-nginx-")))
    node_dir = Path(tempfile.mkdtemp(prefix="jigsaw-fleet-nodes-"))
    try:
        started: dict[str, BaseException | None] = {}

        def start(name: str, d: ServerProcess) -> None:
            try:
                d.start()
                started[name] = None
            except BaseException as exc:  # reported below, after every start ended
                started[name] = exc

        threads = []
        for name in node_names:
            group = fleet.group_of(name)
            share = plan0.apps[app].planned_rps * plan0.apps[app].shares.get(name, 0.0)
            node_file = node_file_for_bench(group.node.source, args.node_solver, node_dir)
            if node_plans:  # the fleet's plan for the node, as a Kubernetes deployment runs it
                plan_file = node_dir / f"{name}.json"
                plan_file.write_text(node_plans[name])
                source = ["--plan", str(plan_file)]
            else:
                source = ["--demand", f"{max(share * slack, 0.1):.3f}",
                          "--bin-seconds", str(args.bin_seconds)]
            d = jigsawd(["--node-config", node_file, "--apps", app, *source,
                         "--time-scale", str(args.time_scale), "--seed", str(args.seed)],
                        out / f"jigsawd-{name}.log", cwd=ROOT)
            log(f"starting {name} on port {d.port} ({share:.1f} rps share)")
            daemons[name] = d
            threads.append(threading.Thread(target=start, args=(name, d), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = {n: e for n, e in started.items() if e is not None}
        if failed or len(started) != len(daemons):
            raise RuntimeError(f"nodes did not start: {failed}")
        addresses = {n: f"127.0.0.1:{d.port}" for n, d in daemons.items()}
        for name, d in daemons.items():  # every node re-plans for its share now, bins restart
            if node_plans:
                break
            share = plan0.apps[app].planned_rps * plan0.apps[app].shares.get(name, 0.0)
            http_json("POST", f"{d.url}/admin/control", {"app": app, "history_rps": [share],
                                                          "replan_rps": share * slack,
                                                          "restart_bins": True}, timeout_s=300)
        nginx.write(plan0, addresses)
        nginx.start()
        log(f"nginx on {nginx.url} ({nginx.dir})")

        def tell(url: str, share_rps: float) -> None:
            """A node whose share moved re-plans now (not at its next bin)."""
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                http_json("POST", f"{url}/admin/control", {"app": app, "replan_rps": share_rps * slack},
                          timeout_s=120)

        def on_bin_end(k: int) -> None:
            t0 = time.monotonic()
            nxt = window[min(k + 1, len(window) - 1)]
            old: FleetPlan = state["plan"]
            fp, _ = plan_fleet(fleet.with_demand({app: nxt * slack}), down=state["down"], curves=curves,
                               plan_nodes=False)
            state["plan"] = fp
            live = {n: a for n, a in addresses.items() if n not in state["down"]}
            nginx.write(fp, live)
            nginx.reload()
            moved = []
            for n in live:
                s_old = old.apps[app].planned_rps * old.apps[app].shares.get(n, 0.0)
                s_new = fp.apps[app].planned_rps * fp.apps[app].shares.get(n, 0.0)
                if not node_plans and s_old > 0 and abs(s_new - s_old) / s_old > SHARE_MOVE:
                    threading.Thread(target=tell, args=(daemons[n].url, s_new), daemon=True).start()
                    moved.append(n)
            state.setdefault("records", []).append({
                "bin": k + 1, "demand_rps": nxt, "down": sorted(state["down"]),
                "weights": fp.weights(app), "replanned_nodes": moved,
                "seconds": round(time.monotonic() - t0, 3)})

        killer = None
        if kill is not None:
            name, kbin = kill

            def do_kill() -> None:
                d = daemons[name]
                if d.proc is not None and d.proc.poll() is None:
                    log(f"killing {name} (SIGKILL to its process group)")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(d.proc.pid, signal.SIGKILL)
                state["down"].add(name)  # the next fleet plan leaves it out

            killer = threading.Timer((kbin + 0.5) * args.bin_seconds, do_kill)
            killer.daemon = True
            killer.start()
        log(f"replaying {len(window)} bins of {args.bin_seconds:g} s through nginx "
            f"({min(window):.0f}..{max(window):.0f} rps, time scale {args.time_scale:g})")
        res = asyncio.run(play(nginx.url, app, window, args.bin_seconds, args.time_scale, args.seed,
                               {a: n for n, a in addresses.items()}, on_bin_end))
        if killer is not None:
            killer.cancel()
        res.replans = state.get("records", [])
        time.sleep(min(2 * args.bin_seconds, 10))  # the nodes close their last bin
        history: dict[str, list[dict[str, Any]]] = {}
        for n, d in daemons.items():
            if n in state["down"]:
                continue
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                history[n] = http_json("GET", f"{d.url}/admin/history?app={app}", timeout_s=10).get(app, [])
            if not history.get(n):  # no controller: the plan it served all along
                with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError):
                    served = http_json("GET", f"{d.url}/admin/plan", timeout_s=10)[app]["plan"]
                    history[n] = [{"plan": served}]
        return res, history
    finally:
        nginx.stop()
        shutil.rmtree(nginx.dir, ignore_errors=True)
        for d in daemons.values():
            with contextlib.suppress(Exception):
                d.close()
        shutil.rmtree(node_dir, ignore_errors=True)


def run_baseline(fleet: Fleet, app: str, window: list[float], curves: FleetCurves, args: argparse.Namespace,
                 out: Path) -> Tally:
    """One node, no nginx, at the fleet's per-node load, started and seeded as the fleet's."""
    group = fleet.groups[0]
    slack = 1 + group.node.planner.demand_slack
    per_node = [r / fleet.num_nodes for r in window]
    node_dir = Path(tempfile.mkdtemp(prefix="jigsaw-fleet-nodes-"))
    try:
        node_file = node_file_for_bench(group.node.source, args.node_solver, node_dir)
        if args.node_control == "fleet":  # the plan a fleet node runs (all nodes share it)
            plan_file = node_dir / "baseline.json"
            plan_file.write_text(next(iter(fleet_node_plans(fleet, app, window, curves, slack).values())))
            source = ["--plan", str(plan_file)]
        else:
            source = ["--demand", f"{per_node[0] * slack:.3f}", "--bin-seconds", str(args.bin_seconds)]
        d = jigsawd(["--node-config", node_file, "--apps", app, *source,
                     "--time-scale", str(args.time_scale), "--seed", str(args.seed)],
                    out / "jigsawd-baseline.log", cwd=ROOT)
        with d:
            if args.node_control == "node":
                http_json("POST", f"{d.url}/admin/control", {"app": app, "history_rps": [per_node[0]],
                                                              "replan_rps": per_node[0] * slack,
                                                              "restart_bins": True}, timeout_s=300)
            res = asyncio.run(play(d.url, app, per_node, args.bin_seconds, args.time_scale, args.seed + 1,
                                   {}, lambda k: None))
    finally:
        shutil.rmtree(node_dir, ignore_errors=True)
    return res.total


def summarize(res: RunResult, history: dict[str, list[dict[str, Any]]], nodes: list[str],
              killed: str | None) -> dict[str, Any]:
    rows = []
    for n in nodes:
        t = res.per_node.get(n, Tally())
        h = history.get(n, [])
        slices = [b["plan"]["slices_used"] for b in h if b.get("plan")]
        avail = next((b["plan"]["slices_available"] for b in h if b.get("plan")), 0)
        rows.append({"node": n, "slices_used_mean": sum(slices) / len(slices) if slices else float("nan"),
                     "slices_available": avail, "sent": t.sent, "violations": t.violations,
                     "violation_pct": 100.0 * t.violations / t.sent if t.sent else 0.0,
                     "failed": t.failed, "killed": n == killed})
    lost_outside = sum(r["failed"] for r in rows if not r["killed"]) + res.unattributed_failed
    lost_killed = sum(r["failed"] for r in rows if r["killed"])
    tot = res.total
    return {"nodes": rows, "sent": res.sent, "answered": res.answered, "violations": tot.violations,
            "violation_pct": 100.0 * tot.violations / tot.sent if tot.sent else 0.0,
            "failed_on_killed_node": lost_killed, "lost_outside_killed_node": lost_outside,
            "slices_used_mean": sum(r["slices_used_mean"] for r in rows
                                    if not math.isnan(r["slices_used_mean"])),
            "slices_available": sum(r["slices_available"] for r in rows), "behind_s": res.behind_s,
            "replans": res.replans, "failures": res.failures}


def print_summary(title: str, s: dict[str, Any]) -> None:
    print(f"\n== {title}")
    print(f"{'node':<12} {'slices used':>12} {'sent':>7} {'violations':>10} {'viol %':>7} {'failed':>7}")
    for r in s["nodes"]:
        mark = "  (killed)" if r["killed"] else ""
        print(f"{r['node']:<12} {r['slices_used_mean']:>6.1f}/{r['slices_available']:<5} {r['sent']:>7} "
              f"{r['violations']:>10} {r['violation_pct']:>7.2f} {r['failed']:>7}{mark}")
    print(f"{'total':<12} {s['slices_used_mean']:>6.1f}/{s['slices_available']:<5} {s['sent']:>7} "
          f"{s['violations']:>10} {s['violation_pct']:>7.2f} "
          f"{s['failed_on_killed_node'] + s['lost_outside_killed_node']:>7}")
    same = "==" if s["sent"] == s["answered"] else "!="
    print(f"sent {s['sent']} {same} answered {s['answered']}; failed on the killed node "
          f"{s['failed_on_killed_node']}, lost outside it {s['lost_outside_killed_node']}; "
          f"{len(s['replans'])} fleet re-plans + nginx reloads; client at most {s['behind_s']:.2f} s behind")
    if s["failures"]:
        print("failures by status and upstream: " + ", ".join(f"{k}: {v}" for k, v in s["failures"].items()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/fleet.py", description=__doc__.splitlines()[0])
    p.add_argument("--fleet", type=Path, default=ROOT / "examples" / "fleet.toml")
    p.add_argument("--app", default=None, help="the fleet's app to replay (default: its first)")
    p.add_argument("--trace", default="synthetic:0")
    p.add_argument("--day", type=int, default=0)
    p.add_argument("--bins", default="150:156", help="window of 5-minute bins of the day")
    p.add_argument("--load", type=float, default=0.7, help="window peak / fleet capacity")
    p.add_argument("--bin-seconds", type=float, default=10.0)
    p.add_argument("--time-scale", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--node-control", default="fleet", choices=("fleet", "node"),
                   help="fleet: nodes run the fleet's node plans (--plan, as k8s render deploys them); "
                        "node: each node's controller re-plans every bin for what it receives")
    p.add_argument("--node-solver", default="highs", choices=("cbc", "highs"),
                   help="the nodes' planner solver (default highs: fast enough for 0.4 x a short bin)")
    p.add_argument("--kill", default=None, metavar="NODE@BIN", help="kill NODE half-way through bin BIN")
    p.add_argument("--no-kill-run", action="store_true", help="with --kill: skip the run without a kill")
    p.add_argument("--baseline", action="store_true", help="also run one node at the per-node load")
    p.add_argument("--out", type=Path, default=Path("out/fleet"))
    return p.parse_args(argv)


def raise_open_files() -> None:
    """Every request in flight is a socket on the client, and two on nginx."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * MAX_CONCURRENCY + 1024
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_open_files()
    fleet = load_fleet(args.fleet)
    app = args.app or fleet.apps[0].name
    if app not in {a.name for a in fleet.apps}:
        log(f"--app: {app!r} is not an app of {args.fleet}")
        return 2
    if len(fleet.apps) > 1:
        fleet = fleet.with_demand({a.name: 0.0 for a in fleet.apps if a.name != app})
    kill = None
    if args.kill:
        name, _, b = args.kill.partition("@")
        nodes = [n for g in fleet.groups for n in g.node_names()]
        if name not in nodes or not b.isdigit():
            log(f"--kill: expected NODE@BIN with NODE one of {', '.join(nodes)}")
            return 2
        kill = (name, int(b))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        _, curves = plan_fleet(fleet, plan_nodes=False)
    except JigsawError as exc:
        log(f"the fleet plan failed: {exc}")
        return 2
    cap = fleet_capacity(fleet, app, curves)
    log(f"fleet {fleet.name}: {fleet.num_nodes} nodes, {app} capacity {cap:.1f} rps "
        f"({time.monotonic() - t0:.1f} s of node capacity solves)")
    try:
        window = window_for(fleet, app, cap, args)
    except TraceError as exc:
        log(str(exc))
        return 2
    nodes = [n for g in fleet.groups for n in g.node_names()]
    report: dict[str, Any] = {"fleet": str(args.fleet), "app": app, "capacity_rps": cap, "load": args.load,
                              "window_rps": window, "bin_seconds": args.bin_seconds,
                              "time_scale": args.time_scale}
    print(f"machine: os.cpu_count()={os.cpu_count()}; emulated nodes, modeled profiles")
    print(f"fleet {fleet.name}: {len(nodes)} nodes, {app} capacity {cap:.1f} rps; window peak "
          f"{max(window):.1f} rps = {args.load:.0%} of it; {len(window)} bins x {args.bin_seconds:g} s, "
          f"time scale {args.time_scale:g}")
    bad = False
    if not (kill and args.no_kill_run):
        res, hist = run_fleet(fleet, app, window, curves, args, args.out, None)
        s = summarize(res, hist, nodes, None)
        report["fleet_run"] = s
        print_summary(f"fleet of {len(nodes)} through nginx, no kill", s)
        bad |= s["sent"] != s["answered"] or s["lost_outside_killed_node"] > 0
    if kill:
        res, hist = run_fleet(fleet, app, window, curves, args, args.out, kill)
        s = summarize(res, hist, nodes, kill[0])
        report["kill_run"] = s
        print_summary(f"fleet of {len(nodes)} through nginx, {kill[0]} killed in bin {kill[1]}", s)
        bad |= s["sent"] != s["answered"] or s["lost_outside_killed_node"] > 0
    if args.baseline:
        t = run_baseline(fleet, app, window, curves, args, args.out)
        base_pct = 100.0 * t.violations / t.sent if t.sent else 0.0
        report["baseline"] = {"sent": t.sent, "violations": t.violations, "violation_pct": base_pct,
                              "failed": t.failed}
        print(f"\n== one node at the per-node load ({max(window) / fleet.num_nodes:.1f} rps peak), no nginx")
        print(f"sent {t.sent}, violations {t.violations} ({base_pct:.2f}%), failed {t.failed}")
        if "fleet_run" in report:
            diff = report["fleet_run"]["violation_pct"] - base_pct
            report["violation_diff_pp"] = diff
            print(f"fleet - one node: {diff:+.2f} percentage points of violations (target: within 0.5)")
    (args.out / "fleet-bench.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out / 'fleet-bench.json'}")
    return 1 if bad else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
