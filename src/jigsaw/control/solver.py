"""The planner in a child process speaking JSON lines, so a solve never holds the daemon's GIL.

python-mip releases the GIL inside CBC, but building the model is Python and takes seconds for
the larger apps: in a thread of the daemon that time would stall the frontend's event loop.

Protocol (one JSON object per line each way; never pickle)::

    -> {"app": NAME, "demand_rps": X, "space": S|null, "previous": PLAN|null,
        "time_limit_s": T|null, "factors": [[src, src_variant, dst, value], ...]|null}
    <- {"plan": PLAN} | {"error": MESSAGE}

    python -m jigsaw.control.solver --node-config N.toml
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from jigsaw.app import App
from jigsaw.node import Node
from jigsaw.plan import Plan
from jigsaw.profiles import ProfileTable

Factors = dict[tuple[str, str, str], float]
MAX_LINE_BYTES = 64 << 20
GRACE_S = 30.0  # beyond the solve's time limit: model building, then the answer's JSON


def hard_timeout_s(time_limit_s: float | None, grace_s: float = GRACE_S) -> float:
    """How long a solve may take before its process is killed (the solver's own limit, x2, + grace)."""
    return 2.0 * (time_limit_s if time_limit_s is not None else 60.0) + grace_s


class SolverError(RuntimeError):
    """The solver process failed or answered with an error."""


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

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._proc

    def __call__(self, app: App, node: Node, profiles: ProfileTable, demand_rps: float, *,
                 space: str | None, previous: Plan | None, time_limit_s: float | None,
                 factors: Factors | None) -> Plan:
        req = {"app": app.name, "demand_rps": demand_rps, "space": space,
               "previous": previous.to_json_dict() if previous is not None else None,
               "time_limit_s": time_limit_s,
               "factors": [[s, v, d, x] for (s, v, d), x in factors.items()] if factors else None}
        limit_s = hard_timeout_s(time_limit_s, self.grace_s)
        with self._lock:
            proc = self._ensure()
            assert proc.stdin is not None and proc.stdout is not None
            timer = threading.Timer(limit_s, proc.kill)
            timer.start()
            try:
                proc.stdin.write(json.dumps(req).encode() + b"\n")
                proc.stdin.flush()
                line = proc.stdout.readline(MAX_LINE_BYTES)
            except OSError as exc:
                self.close()
                raise SolverError(f"solver process: {exc}") from None
            finally:
                timer.cancel()
            if not line:
                try:
                    killed = proc.wait(timeout=2.0) < 0
                except subprocess.TimeoutExpired:
                    killed = False
                self.close()
                if killed:
                    raise SolverError(f"solver timed out after {limit_s:g} s (killed; restarted on the next "
                                      "re-plan)")
                raise SolverError("solver process exited")
        doc = json.loads(line)
        if "error" in doc:
            raise SolverError(doc["error"])
        return Plan.from_json_dict(doc["plan"], "<solver>")

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


def _serve(node_config: Path) -> int:
    from jigsaw.node import load_node, load_node_profiles
    from jigsaw.planner.milp import plan
    node = load_node(node_config)
    profiles = load_node_profiles(node)
    for line in sys.stdin:
        try:
            req: dict[str, Any] = json.loads(line)
            app = node.app(req["app"])
            prev = req.get("previous")
            factors = {(str(s), str(v), str(d)): float(x) for s, v, d, x in req["factors"]} \
                if req.get("factors") else None
            p = plan(app, node, profiles, float(req["demand_rps"]), space=req.get("space"),
                     previous=Plan.from_json_dict(prev) if prev else None,
                     time_limit_s=req.get("time_limit_s"), factors=factors)
            out: dict[str, Any] = {"plan": p.to_json_dict()}
        except Exception as exc:  # answered, never fatal: the daemon keeps its running plan
            out = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jigsaw.control.solver", description=__doc__.splitlines()[0])
    p.add_argument("--node-config", required=True, type=Path)
    args = p.parse_args(argv)
    return _serve(args.node_config)


if __name__ == "__main__":
    sys.exit(main())
