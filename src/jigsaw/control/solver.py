"""The node's planner, in process (``solve_node``) or in a child process speaking JSON lines.

Every re-plan is one decision for all the node's apps (``planner.node_plan.plan_node``). With
``on_quick`` the planner first hands over a verified greedy node plan (``quick_plan_node``,
about 100 ms) and then solves exactly; the controller decides whether to deploy the first.

The child process exists so that a solve never holds the daemon's GIL: python-mip releases it
inside CBC, but building the model is Python and takes a while for the larger apps; in a thread
of the daemon that time would stall the frontend's event loop.

Protocol (one JSON object per line each way; never pickle)::

    -> {"apps": [NAME, ...], "demands": {NAME: RPS}, "space": S|null,
        "previous": {NAME: PLAN}|null, "time_limit_s": T|null,
        "factors": {NAME: [[src, src_variant, dst, value], ...]}|null, "quick": bool}
    <- {"quick": NODE_PLAN}      (only with "quick": true, and only when the greedy found one)
    <- {"plan": NODE_PLAN} | {"error": MESSAGE}

    python -m jigsaw.control.solver --node-config N.toml
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from jigsaw.app import App
from jigsaw.control import precompute_store
from jigsaw.control.precompute import Precompute
from jigsaw.node import Node
from jigsaw.plan import NodePlan, Plan
from jigsaw.planner.node_plan import (
    QUICK_STATUS,
    merge_layouts,
    plan_node,
    plan_node_anytime,
    quick_plan_node,
)
from jigsaw.planner.problem import make_problem
from jigsaw.profiles import ProfileTable
from jigsaw.spaces import search_space

Factors = dict[tuple[str, str, str], float]
QuickSink = Callable[[NodePlan], None]
MAX_LINE_BYTES = 64 << 20
SOLVER_NAME = b"jigsaw-solver"  # its /proc/<pid>/comm
GRACE_S = 30.0  # beyond the solve's time limit: model building, then the answer's JSON
MIN_GRACE_S = 3.0  # the least grace ``grace_for_bins`` gives: the answer's JSON on a loaded host


def hard_timeout_s(time_limit_s: float | None, grace_s: float = GRACE_S) -> float:
    """How long a solve may take before its process is killed (the solver's own limit, x2, + grace)."""
    return 2.0 * (time_limit_s if time_limit_s is not None else 60.0) + grace_s


def grace_for_bins(bin_seconds: float, bins: float) -> float:
    """The grace of a controller whose bins last ``bin_seconds``: ``bins`` of them (at least
    ``MIN_GRACE_S``, at most ``GRACE_S``); ``GRACE_S`` when ``bins`` is 0
    (``control.solver_grace_bins``).

    Why: the controller holds its re-plan lock while it waits for the solve, so a solve that
    overruns its limit freezes every re-plan of the node, and its process keeps a core busy. With
    compressed 5 s bins the fixed 30 s grace was 34 s: on day 0 of traffic_analysis one such solve
    (a routine re-plan after the first spike, 2 s limit) held the node for seven bins while the
    2-core host's serving processes starved (45% violations in a bin served by a 20-slice plan
    at 360 req/s). The problems are built when the process starts (``warm_up``), so the grace
    covers the answer, not a model build.
    """
    if bins <= 0:
        return GRACE_S
    return min(GRACE_S, max(MIN_GRACE_S, bins * bin_seconds))


class SolverError(RuntimeError):
    """The solver process failed or answered with an error."""


def previous_node_plan(node: Node, previous: Mapping[str, Plan] | None) -> NodePlan | None:
    """The running plans as a node plan whose layout the packer keeps what it can of."""
    if not previous:
        return None
    layout = merge_layouts(previous, node.gpu.name, node.num_gpus)
    return NodePlan(node=node.name, objective_kind=node.planner.objective, status="running", feasible=True,
                    objective=float("nan"), gap=float("inf"),
                    slices_used=sum(p.slices_used for p in previous.values()),
                    slices_available=node.slices_available, solve_seconds=0.0, plans=dict(previous),
                    layout=layout)


def solve_node(apps: Sequence[App], node: Node, profiles: ProfileTable, demands: Mapping[str, float], *,
               space: str | None, previous: Mapping[str, Plan] | None, time_limit_s: float | None,
               factors: Mapping[str, Factors] | None, on_quick: QuickSink | None = None) -> NodePlan:
    """One node-wide decision in this process (a ``controller.Solver``); ``on_quick`` first gets
    the verified quick plan when the greedy finds one."""
    prev = previous_node_plan(node, previous)
    if on_quick is None:
        return plan_node(apps, node, profiles, demands, space=space, previous=prev,
                         time_limit_s=time_limit_s, factors=factors)
    result = None
    for p in plan_node_anytime(apps, node, profiles, demands, space=space, previous=prev,
                               time_limit_s=time_limit_s, factors=factors):
        if p.status == QUICK_STATUS and result is None:
            on_quick(p)
        result = p
    assert result is not None
    return result


class SubprocessSolver:
    """A ``controller.Solver`` backed by one long-lived child process (restarted if it dies)."""

    def __init__(self, node_config: Path, *, command: list[str] | None = None,
                 grace_s: float = GRACE_S) -> None:
        self.node_config = Path(node_config)
        self.grace_s = grace_s
        self.command = command or [sys.executable, "-m", "jigsaw.control.solver", "--node-config",
                                   str(self.node_config)]
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process now (else at the first request). Why: it spends its idle time on the
        precompute (``control.precompute``), which the first spike's plan wants done, and reads
        what an earlier process kept of it before it answers."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._proc

    def __call__(self, apps: Sequence[App], node: Node, profiles: ProfileTable,
                 demands: Mapping[str, float], *, space: str | None, previous: Mapping[str, Plan] | None,
                 time_limit_s: float | None, factors: Mapping[str, Factors] | None,
                 on_quick: QuickSink | None = None) -> NodePlan:
        req = {"apps": [a.name for a in apps], "demands": {k: float(v) for k, v in demands.items()},
               "space": space, "time_limit_s": time_limit_s, "quick": on_quick is not None,
               "previous": {k: p.to_json_dict() for k, p in previous.items()} if previous else None,
               "factors": {a: [[s, v, d, x] for (s, v, d), x in f.items()] for a, f in factors.items()}
               if factors else None}
        limit_s = hard_timeout_s(time_limit_s, self.grace_s)
        with self._lock:
            proc = self._ensure()
            assert proc.stdin is not None and proc.stdout is not None
            expired = threading.Event()  # the timer killed it: a timeout, not a crash

            def expire() -> None:
                expired.set()
                proc.kill()

            timer = threading.Timer(limit_s, expire)
            timer.start()
            try:
                proc.stdin.write(json.dumps(req).encode() + b"\n")
                proc.stdin.flush()
                while True:
                    line = proc.stdout.readline(MAX_LINE_BYTES)
                    if not line:
                        break
                    doc = json.loads(line)
                    if "quick" not in doc:
                        break
                    if on_quick is not None:
                        on_quick(NodePlan.from_json_dict(doc["quick"], "<solver>"))
            except OSError as exc:
                self.close()
                raise SolverError(f"solver process: {exc}") from None
            finally:
                timer.cancel()
            if not line:
                try:
                    status: int | None = proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    status = None
                self.close()
                raise SolverError(_ended(status, expired.is_set(), limit_s))
        if "error" in doc:
            raise SolverError(doc["error"])
        return NodePlan.from_json_dict(doc["plan"], "<solver>")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _ended(status: int | None, expired: bool, limit_s: float) -> str:
    """Why the solver process gave no answer. Why: a solver library that crashes (CBC has died of
    SIGSEGV under load) is not a solve that ran out of time; the log says which it was."""
    if expired:
        return f"solver timed out after {limit_s:g} s (killed; restarted on the next re-plan)"
    if status is not None and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"solver process died of {name} (restarted on the next re-plan)"
    return f"solver process exited ({'still running' if status is None else f'status {status}'}; " \
        "restarted on the next re-plan)"


_PROTOCOL: TextIO = sys.stdout  # the daemon's end of the JSON lines (see ``_claim_stdout``)


def _claim_stdout() -> None:
    """Keep standard output for the protocol alone: its descriptor is duplicated for the answers,
    and descriptor 1 then points at standard error, so whatever a solver library prints there
    (HiGHS 1.16 prints a banner when its first model is made) cannot corrupt a line."""
    global _PROTOCOL
    sys.stdout.flush()
    _PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)


def _answer(doc: dict[str, Any]) -> None:
    _PROTOCOL.write(json.dumps(doc) + "\n")
    _PROTOCOL.flush()


def warm_up(node: Node, profiles: ProfileTable) -> None:
    """Build what every quick plan of the node's apps starts from (each app's columns, its LP
    relaxations and greedy tables: ``planner.problem.make_problem``, ``Problem.derived``) before
    the first request, by one quick node plan at a small demand.

    Why: the quick plan takes about 40 ms warm and 100-170 ms cold (the columns built in the
    call); a burst's first re-plan would pay the cold time. Problems with measured factors
    (``--factors``) are new problems, built at their first use. A failure here is the first
    request's to report, not the process's."""
    try:
        quick_plan_node(node.apps, node, profiles, {a.name: 1.0 for a in node.apps})
    except Exception:
        return


def _lines(pre: Precompute) -> Iterator[bytes]:
    """The requests on standard input, one line each, while the precompute's steps run whenever
    none is waiting: a request's first byte kills the running step (``Precompute.cancel``)."""
    buf = b""
    while True:
        while b"\n" not in buf:
            pre.start()
            fds = [0] if pre.fd is None else [0, pre.fd]
            wait = None if pre.fd is None else max(0.0, pre.deadline - time.monotonic())
            ready, _, _ = select.select(fds, [], [], wait)
            if not ready:
                pre.expire()
                continue
            if pre.fd is not None and pre.fd in ready and 0 not in ready:
                pre.readable()
                continue
            pre.cancel()
            chunk = os.read(0, 1 << 20)
            if not chunk:
                return
            buf += chunk
            if len(buf) > MAX_LINE_BYTES:
                raise SolverError(f"a request line over {MAX_LINE_BYTES} bytes")
        line, buf = buf.split(b"\n", 1)
        yield line


def _serve(node_config: Path, precompute_step_s: float | None) -> int:
    from jigsaw.node import load_node, load_node_profiles
    node = load_node(node_config)
    profiles = load_node_profiles(node)
    warm_up(node, profiles)
    sp = search_space(node.planner.space)
    pre = Precompute([make_problem(a, node, profiles, sp, None) for a in node.apps], node,
                     solver=node.planner.solver, step_limit_s=node.planner.precompute_step_s
                     if precompute_step_s is None else precompute_step_s, store=precompute_store.cache_dir())
    for line in _lines(pre):
        try:
            req: dict[str, Any] = json.loads(line)
            apps = [node.app(str(name)) for name in req["apps"]]
            prev = req.get("previous") or {}
            factors = {str(a): {(str(s), str(v), str(d)): float(x) for s, v, d, x in rows}
                       for a, rows in req["factors"].items()} if req.get("factors") else None
            quick = (lambda q: _answer({"quick": q.to_json_dict()})) if req.get("quick") else None
            p = solve_node(apps, node, profiles, {str(k): float(v) for k, v in req["demands"].items()},
                           space=req.get("space"),
                           previous={str(k): Plan.from_json_dict(v) for k, v in prev.items()},
                           time_limit_s=req.get("time_limit_s"), factors=factors,
                           on_quick=quick)
            out: dict[str, Any] = {"plan": p.to_json_dict()}
        except Exception as exc:  # answered, never fatal: the daemon keeps its running plan
            out = {"error": f"{type(exc).__name__}: {exc}"}
        _answer(out)
    return 0


def _name_process(name: bytes) -> None:
    """Set this process's /proc/<pid>/comm (PR_SET_NAME). Why: the daemon's children are its
    workers and this process; ``ps``, ``top`` and the tests that check workers' placement tell
    them apart by name."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, ctypes.c_char_p(name[:15]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jigsaw.control.solver", description=__doc__.splitlines()[0])
    p.add_argument("--node-config", required=True, type=Path)
    p.add_argument("--precompute-step-s", type=float, default=None,
                   help="the node's planner.precompute_step_s instead")
    args = p.parse_args(argv)
    _claim_stdout()
    _name_process(SOLVER_NAME)
    return _serve(args.node_config, args.precompute_step_s)


if __name__ == "__main__":
    sys.exit(main())
