"""The burst on a fresh node: N concurrent requests to a freshly started jigsawd, per app.

    python bench/burst.py [--node examples/h100x4.toml] [--apps traffic_analysis,social_media,ar_assistant]
        [--burst 40] [--rounds 5] [--set section.key=value] [--out out/burst]

For each app it starts ``jigsawd --emulate --node-config NODE --apps APP --plan-time-limit 5`` (its
default plan: no demand given, so the plan holds the node's burst floor, ``control.burst_requests``
requests within half the SLO), sends ``--burst`` requests at once ``--rounds`` times in a row, and
prints per round how many were answered 200, how many of those within the app's latency SLO (wall
time: the emulated node runs at time scale 1), the slowest answer and the other statuses. This is
``tests/control/test_burst.py``'s measure (traffic_analysis only there) for every app of the node;
the issue's target is 40/40 within the SLO. Each request is one zero-filled body from the model's
metadata (``bench/replay.py``'s). Exit 1 when a round falls short. Emulated node, modeled profiles.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "src"))  # an installed or PYTHONPATH jigsaw comes first

from replay import http_json, node_with_settings, request_body  # noqa: E402

from jigsaw.node import load_node  # noqa: E402
from jigsaw.testing import jigsawd  # noqa: E402

PLAN_TIME_LIMIT_S = 5.0  # the test's: a fresh node's first plan within 5 s
REQUEST_TIMEOUT_S = 30.0


def one_request(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    """POST one inference; its status (0: no answer) and wall latency in ms."""
    t0 = time.monotonic()
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        status = 0
    return status, (time.monotonic() - t0) * 1000.0


def burst(url: str, app: str, n: int) -> list[tuple[int, float]]:
    """``n`` concurrent requests to ``app`` (one thread each, all sent at once)."""
    body, headers = request_body(http_json("GET", f"{url}/v2/models/{app}"))
    infer = f"{url}/v2/models/{app}/infer"
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: one_request(infer, body, headers), range(n)))


def within_slo(got: list[tuple[int, float]], slo_ms: float) -> int:
    """Requests answered 200 within ``slo_ms``: the issue's count."""
    return sum(1 for status, ms in got if status == 200 and ms <= slo_ms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/burst.py", description=__doc__.splitlines()[0])
    p.add_argument("--node", type=Path, default=ROOT / "examples" / "h100x4.toml")
    p.add_argument("--apps", default=None, help="comma-separated apps (default: every app of the node)")
    p.add_argument("--burst", type=int, default=40, help="concurrent requests per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="start jigsawd on a copy of the node file with this setting (as bench/replay.py)")
    p.add_argument("--out", type=Path, default=None, help="keep jigsawd's logs here (default: a temp dir)")
    args = p.parse_args(argv)
    if args.burst < 1 or args.rounds < 1:
        raise SystemExit("burst: --burst and --rounds must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="burst-"))
    out.mkdir(parents=True, exist_ok=True)
    node_path = node_with_settings(args.node, args.set, out)
    node = load_node(node_path)
    apps = args.apps.split(",") if args.apps else [a.name for a in node.apps]
    short = 0
    print(f"burst of {args.burst} concurrent requests, {args.rounds} rounds, on a fresh node per app "
          f"({args.node.name}; emulated node, modeled profiles)")
    for app in apps:
        slo_ms = node.app(app).latency_slo_ms
        cmd = ["--node-config", str(node_path), "--apps", app, "--plan-time-limit", f"{PLAN_TIME_LIMIT_S:g}"]
        with jigsawd(cmd, out / f"jigsawd-{app}.log", ready_timeout_s=180.0) as server:
            plan = http_json("GET", f"{server.url}/admin/plan")[app]["summary"]
            print(f"{app}: SLO {slo_ms:g} ms, default plan for {plan['demand_rps']:.1f} rps on "
                  f"{plan['slices_used']} slices")
            for k in range(args.rounds):
                got = burst(server.url, app, args.burst)
                ok = within_slo(got, slo_ms)
                statuses = [s for s, _ in got]
                others = {s: statuses.count(s) for s in sorted(set(statuses)) if s != 200}
                print(f"  round {k}: {ok}/{args.burst} answered 200 within the SLO "
                      f"({statuses.count(200)} answered 200), slowest {max(ms for _, ms in got):.0f} ms"
                      f"{f', other statuses {others}' if others else ''}", flush=True)
                short += ok < args.burst
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
