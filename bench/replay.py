"""Replay a day of demand against jigsawd with the controller on: the paper's Fig. 4 on this node.

    python bench/replay.py --node examples/h100x4.toml --app traffic_analysis \\
        --trace twitter:../shared/data/twitter/workload.tbz2 --day 0 --bins 96:144 \\
        --scale-to-capacity --spaces ast,as,at,st --bin-seconds 10 --time-scale 4 --out out/replay

For each space it starts jigsawd (``--node``; or uses ``--url``), seeds the controller's history
with the bins before the window and aligns the daemon's bins with the replay's
(``POST /admin/control``), then plays every bin for ``--bin-seconds`` wall seconds with open-loop
Poisson arrivals at the bin's rate / ``--time-scale``. Per bin it writes demand, the
controller's prediction and plan (from ``GET /admin/history``), SLO violations and latency
percentiles in node time (measured / time scale). Results on ``--emulate`` are emulated: the
profiles are modeled.

The paper's metrics (§4.5): slices used as a % of the node's available slices, the accuracy drop
as a % of the app's best accuracy, and the latency SLO violation rate counted two ways. The plain
rate counts every non-200 answer or failed request once (504 dropped or late, 503 shed). The
paper's rate counts an early-dropped request once per item the dropping task would have produced
(its multiplicative factor, the 504 body's ``items_lost``), over the requests plus those extra
items, so it stays a fraction. The client must keep its schedule: an arrival sent more than
``BEHIND_THRESHOLD_S`` late marks its bin behind, is reported, and fails the run (exit 1), since
a late client measures a gentler load than the trace's.

``--steady-state`` measures each bin after the node settled (the paper's way): the bin is played
for ``--settle-seconds`` at its rate first, not counted, then ``--bin-seconds`` measured, then
``--tail-seconds`` more at its rate, not counted either; jigsawd's bins are the three together.
The tail keeps the next bin's re-plan, which starts ``lead_s`` before the daemon's bin ends, off
the measured requests still in flight (see ``default_tail_s``).
``--set section.key=value`` starts jigsawd on a copy of the node file with that setting: the
ablation (``bench/ablation.py``) switches each mechanism off this way.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "src"))  # an installed or PYTHONPATH jigsaw comes first

from jigsaw.errors import JigsawError  # noqa: E402
from jigsaw.spaces import SPACES  # noqa: E402
from jigsaw.testing import jigsawd  # noqa: E402
from jigsaw.traces import (  # noqa: E402
    DEFAULT_BIN_SECONDS,
    TraceError,
    day_bins,
    parse_bins,
    parse_trace_spec,
)

CSV_FIELDS = ("bin", "demand_rps", "predicted_rps", "slices_used_pct", "accuracy_drop_pct",
              "slo_violation_pct", "slo_violation_paper_pct", "p50_ms", "p99_ms", "sent", "answered",
              "violations", "violations_paper", "extra_items", "shed_503", "dropped_504", "other_failed",
              "behind", "behind_s", "settle_lost")
# what jigsawd imports beyond the standard library (pyproject.toml's dependencies)
RUNTIME_MODULES = ("posix_ipc", "aiohttp", "uvloop", "httptools", "orjson", "highspy", "mip", "numpy", "yaml")


def missing_runtime() -> str | None:
    """One line saying how to run a bench where this Python lacks jigsaw's dependencies (they
    would fail in the daemon it starts, as nested tracebacks), else None."""
    import importlib.util
    missing = [m for m in RUNTIME_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (f"{sys.executable} lacks jigsaw's dependencies ({', '.join(missing)}): run the bench with the "
            f"project's environment, e.g. .venv/bin/python {' '.join(sys.argv) or 'bench/replay.py'} "
            "(`make setup` or `make demo` creates .venv), or `pip install -e '.[bench]'` into this one")


MIN_CONCURRENCY = 512  # requests the client keeps in flight at least
# Little's law: a client keeps rate x latency requests in flight, the same at every time scale (the
# rate / K, the latency x K); a request lives about its SLO at most (then it is answered 504), so
# the window's peak rate x the SLO bounds it, and this margin covers the tail. A cap below that
# makes the client wait for a free slot and fall behind its schedule: social_media's peak window
# (8500 rps x 0.7 s, about 6000 in flight) against the 512 it had fell 93 s behind.
CONCURRENCY_MARGIN = 1.5
DEFAULT_SLO_MS = 1000.0  # with --url and no node file the app's SLO is not known
BEHIND_THRESHOLD_S = 0.25  # an arrival sent this much later than scheduled marks its bin behind
TAIL_TIMEOUT_S = 60.0
# --steady-state's default unmeasured tail (``default_tail_s``): a measured request is answered
# (or dropped, 504) within its SLO x the time scale; in the peak-window steady-state runs the
# median bin's p99 answer was 0.20-0.53 of the SLO (traffic_analysis 132 ms of 650, ar_assistant
# 345-361 of 1550, social_media 372 of 700), so half the SLO covers the common bin's p99. The next
# bin's re-plan starts the controller's lead before the daemon bin's end (1.25 x its smoothed
# re-plan time, at most half a bin): its median over those runs was 0.35-2.0 s.
TAIL_ANSWER_SLO_FRACTION = 0.5
TAIL_LEAD_ALLOWANCE_S = 2.0
READY_TIMEOUT_S = 180.0


def log(msg: str) -> None:
    print(f"replay: {msg}", file=sys.stderr, flush=True)


# ---- the bins to play ---------------------------------------------------------------------
def capacity_rps(node_path: Path, app: str, space: str = "ast") -> float:
    """The app's maximum serviceable demand under ``space`` (the paper scales the trace to it)."""
    from jigsaw.node import load_node, load_node_profiles
    from jigsaw.planner.milp import capacity
    node = load_node(node_path)
    a = node.app(app)
    return capacity(a, node, load_node_profiles(node, [a]), space=space).max_demand_rps


def demand_window(trace: str, day: int, bins: str | None, peak_rps: float | None,
                  history_bins: int = 5) -> tuple[list[float], list[float], int]:
    """(the day's bins scaled, the window's bins, index of its first bin) plus history before it."""
    spec = parse_trace_spec(trace)
    scaled = day_bins(spec, day=day, bin_seconds=DEFAULT_BIN_SECONDS, peak_rps=peak_rps)
    a, b = parse_bins(bins, len(scaled))
    return scaled[max(0, a - history_bins):a], scaled[a:b], a


def client_concurrency(peak_rps: float, latency_slo_ms: float) -> int:
    """How many requests the client may keep in flight (see ``CONCURRENCY_MARGIN``)."""
    return max(MIN_CONCURRENCY, math.ceil(CONCURRENCY_MARGIN * peak_rps * latency_slo_ms / 1000.0))


def default_tail_s(latency_slo_ms: float, time_scale: float) -> float:
    """Wall seconds of unmeasured play after a steady-state bin's measured seconds, by default.

    Long enough that the next bin's routine re-plan (its lead before the daemon bin's end) begins
    after the measured requests are answered in the common case: their p99 answer time in wall
    seconds (``TAIL_ANSWER_SLO_FRACTION`` of the SLO x the time scale) plus the controller's usual
    lead (``TAIL_LEAD_ALLOWANCE_S``). A lead near its cap (half a bin, after a slow solve) or an
    answer near the SLO still reaches the measured requests; covering those would triple the run.
    """
    return round(TAIL_ANSWER_SLO_FRACTION * latency_slo_ms / 1000.0 * time_scale + TAIL_LEAD_ALLOWANCE_S, 1)


@dataclass(frozen=True)
class BinSplit:
    """How each bin's wall seconds are played: ``settle_s`` unmeasured, ``measured_s``, ``tail_s`` unmeasured.

    Every part runs at the bin's rate; jigsawd's bin is the whole period, so its bins stay aligned
    with the client's and the measured seconds sit between the bin's own transitions (settle) and
    the next bin's re-plan (tail).
    """
    settle_s: float
    measured_s: float
    tail_s: float = 0.0

    @property
    def period_s(self) -> float:
        """The daemon's bin length (its ``--bin-seconds``)."""
        return self.settle_s + self.measured_s + self.tail_s

    def measured(self, offset_s: float) -> bool:
        """Whether an arrival this far into the bin counts in the bin's measured result."""
        return self.settle_s <= offset_s < self.settle_s + self.measured_s

    def describe(self) -> str:
        return (f"{self.settle_s:g} s settling + {self.measured_s:g} s measured + {self.tail_s:g} s tail "
                f"= {self.period_s:g} s daemon bin")

    def to_json(self) -> dict[str, float]:
        return {"settle_s": self.settle_s, "measured_s": self.measured_s, "tail_s": self.tail_s,
                "daemon_bin_s": self.period_s}


def poisson_times(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival offsets in [0, duration) of a Poisson process of ``rate_per_s``."""
    out: list[float] = []
    if rate_per_s <= 0:
        return out
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def app_slo_ms(args: argparse.Namespace) -> float:
    """The app's latency SLO from the node file (``--node`` or ``--capacity-node``), else a default."""
    node_path = args.node or args.capacity_node
    if node_path is None:
        return DEFAULT_SLO_MS
    from jigsaw.node import load_node
    try:
        return load_node(node_path).app(args.app).latency_slo_ms
    except (JigsawError, KeyError, ValueError):
        return DEFAULT_SLO_MS


# ---- the daemon ---------------------------------------------------------------------------
def http_json(method: str, url: str, body: Any = None, token: str = "", timeout_s: float = 600.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read().decode())


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ValueError(f"cannot write {type(v).__name__} to TOML")


def _toml_text(doc: dict[str, Any], prefix: str = "") -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{prefix}{k}]", _toml_text(v, f"{prefix}{k}.")]
    return "\n".join(lines)


def node_with_settings(node_path: Path, settings: list[str], out_dir: Path) -> Path:
    """A copy of ``node_path`` with ``section.key=value`` settings (TOML values) in ``out_dir``.

    The ablation switches mechanisms this way (``--set server.lane_shift=false``); the copy's
    app and profile paths are made absolute so it loads from anywhere.
    """
    import tomllib

    from jigsaw.node import load_node
    if not settings:
        return node_path
    doc = tomllib.loads(node_path.read_text())
    base = node_path.resolve().parent
    doc["apps"] = [str((base / a).resolve()) for a in doc.get("apps", [])]
    doc.setdefault("gpus", {})["profiles_dir"] = str(load_node(node_path, load_apps=False).profiles_dir)
    for item in settings:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"--set {item!r}: expected section.key=value (e.g. server.lane_shift=false)")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word: a string
        doc.setdefault(section, {})[name] = value
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{node_path.stem}-set.toml"
    path.write_text(_toml_text(doc) + "\n")
    load_node(path)  # a bad setting fails here, naming the file and field
    return path


# ---- the machine ---------------------------------------------------------------------------
@dataclass
class MachineLoad:
    """The machine's 1-minute load average, sampled at the start and at each bin's end.

    Why: the emulated node keeps a GPU node's timing only while its worker processes, its loop and
    its solver get a CPU when they need one. With five replays side by side on the 2-core machine
    a solve was killed at its 50 s limit and two clients fell behind, and the same window measured
    differently from run to run; so every summary says how loaded the machine was, the replay's
    own node and client included, and a reader can tell a loaded run from a quiet one."""

    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    samples: list[float] = field(default_factory=list)
    read: Callable[[], float] | None = None  # the 1-minute load average; os.getloadavg's by default

    def sample(self) -> None:
        try:
            load = self.read() if self.read is not None else os.getloadavg()[0]
        except OSError:  # no load average on this platform: nothing to report
            return
        self.samples.append(float(load))

    def to_json(self) -> dict[str, Any]:
        """``cpus``, and the mean and max of the samples (None when there were none)."""
        xs = self.samples
        return {"cpus": self.cpus, "load_1m_mean": round(sum(xs) / len(xs), 2) if xs else None,
                "load_1m_max": round(max(xs), 2) if xs else None}

    def describe(self) -> str:
        got = self.to_json()
        if got["load_1m_max"] is None:
            return "machine load unknown"
        over = " (past its CPUs: processes waited for one, so the emulated timings may have run slower)" \
            if got["load_1m_max"] > self.cpus else ""
        return (f"machine load (1-minute average, this replay's node and client included) "
                f"{got['load_1m_mean']:.2f} mean, {got['load_1m_max']:.2f} max on {self.cpus} CPUs{over}")


# ---- the load -----------------------------------------------------------------------------
@dataclass
class BinResult:
    sent: int = 0
    answered: int = 0
    violations: int = 0
    violations_paper: float = 0.0  # an early drop counts its dropping task's factor
    extra_items: float = 0.0  # what those factors add to the denominator
    latencies_ms: list[float] = field(default_factory=list)
    behind: bool = False
    behind_s: float = 0.0  # the most any arrival of the bin was sent late
    # where the violations come from: shed at the door (503), dropped or late in the node (504),
    # anything else (another status, a client timeout or error)
    shed_503: int = 0
    dropped_504: int = 0
    other_failed: int = 0

    @property
    def violation_pct(self) -> float:
        return 100.0 * self.violations / self.answered if self.answered else 0.0

    @property
    def violation_paper_pct(self) -> float:
        total = self.answered + self.extra_items
        return 100.0 * self.violations_paper / total if total else 0.0


def items_lost(status: int, body: bytes) -> float:
    """How many violations a non-200 answer counts for in the paper's way (§4.5)."""
    if status != 504:
        return 1.0
    try:
        doc = json.loads(body)
        return max(1.0, float(doc.get("items_lost", 1.0)))
    except (ValueError, TypeError, AttributeError):
        return 1.0


_ITEM_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
               "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}


def request_body(model: dict[str, Any], binary: bool = True) -> tuple[bytes, dict[str, str]]:
    """One request body of zeros (free dimensions 16) and its headers.

    ``binary``: numeric inputs travel as raw bytes after the JSON header (the OIP binary tensor
    data extension), so neither side spends its CPU on long JSON arrays.
    """
    inputs, blobs = [], []
    for spec in model.get("inputs", []):
        shape = [16 if d < 0 else d for d in spec["shape"]]
        n = math.prod(shape)
        tensor: dict[str, Any] = {"name": spec["name"], "datatype": spec["datatype"], "shape": shape}
        if binary and spec["datatype"] in _ITEM_BYTES:
            blobs.append(bytes(n * _ITEM_BYTES[spec["datatype"]]))
            tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
        else:
            tensor["data"] = [0] * n if spec["datatype"] != "BYTES" else ["x"] * n
        inputs.append(tensor)
    head = json.dumps({"inputs": inputs}).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}


async def play(url: str, app: str, window: list[float], split: BinSplit, time_scale: float,
               seed: int, progress: Any,
               max_concurrency: int = MIN_CONCURRENCY) -> tuple[list[BinResult], BinResult]:
    """Open-loop Poisson arrivals, bin by bin; every request is awaited (bounded by its timeout).

    ``split`` (steady state): each bin is played for ``split.period_s`` at its rate, and the
    arrivals of its settling and tail count only in the second result (sent and answered, not
    measured).
    """
    import aiohttp
    rng = random.Random(seed)
    results = [BinResult() for _ in window]
    settling = BinResult()
    model = http_json("GET", f"{url}/v2/models/{app}")
    body, headers = request_body(model)
    infer = f"{url}/v2/models/{app}/infer"
    sem = asyncio.Semaphore(max_concurrency)
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=TAIL_TIMEOUT_S)
    conn = aiohttp.TCPConnector(limit=max_concurrency)

    async def one(session: aiohttp.ClientSession, r: BinResult) -> None:
        t0 = time.monotonic()
        weight = 1.0
        status = 0
        try:
            async with session.post(infer, data=body, headers=headers) as resp:
                answer = await resp.read()
                status = resp.status
                ok = status == 200
                if not ok:
                    weight = items_lost(status, answer)
        except (TimeoutError, aiohttp.ClientError):
            ok = False
        finally:
            sem.release()
        r.answered += 1
        if ok:
            r.latencies_ms.append((time.monotonic() - t0) * 1000.0 / time_scale)
        else:
            r.violations += 1
            if status == 503:
                r.shed_503 += 1
            elif status == 504:
                r.dropped_504 += 1
            else:
                r.other_failed += 1
            r.violations_paper += weight
            r.extra_items += weight - 1.0

    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.monotonic()
        for k, rate in enumerate(window):
            period = split.period_s
            bin_start = start + k * period
            for off in poisson_times(rate / time_scale, period, rng):
                r = results[k] if split.measured(off) else settling
                due = bin_start + off
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                await sem.acquire()
                late_s = time.monotonic() - due
                results[k].behind_s = max(results[k].behind_s, late_s)
                if late_s > BEHIND_THRESHOLD_S and not results[k].behind:
                    results[k].behind = True
                    log(f"bin {k}: the client is {late_s:.2f} s behind its schedule "
                        f"({len(tasks)} requests in flight, at most {max_concurrency})")
                r.sent += 1
                t = asyncio.get_running_loop().create_task(one(session, r))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            end = bin_start + period
            if end > time.monotonic():
                await asyncio.sleep(end - time.monotonic())
            progress(k, results[k])
        if tasks:
            await asyncio.wait(set(tasks), timeout=TAIL_TIMEOUT_S + 5)
    return results, settling


def _progress_factory(n: int, label: str, load: MachineLoad | None = None) -> tuple[Any, Any]:
    """(update, close): the bar (or a line per bin without tqdm); ``load`` is sampled per bin."""
    update, close = _progress_bar(n, label)
    if load is None:
        return update, close

    def sampled(k: int, r: BinResult) -> None:
        load.sample()
        update(k, r)
    return sampled, close


def _progress_bar(n: int, label: str) -> tuple[Any, Any]:
    try:
        from tqdm import tqdm
    except ImportError:
        def plain(k: int, r: BinResult) -> None:
            print(f"[{label}] bin {k + 1}/{n}: sent {r.sent}", file=sys.stderr, flush=True)
        return plain, lambda: None
    bar = tqdm(total=n, desc=label, unit="bin", file=sys.stderr)

    def update(k: int, r: BinResult) -> None:
        bar.set_postfix(sent=r.sent)
        bar.update(1)
    return update, bar.close


# ---- one space ----------------------------------------------------------------------------
def run_space(url: str, app: str, space: str, window: list[float], history: list[float], first_bin: int,
              split: BinSplit, time_scale: float, seed: int, token: str,
              history_out: Path | None = None,
              max_concurrency: int = MIN_CONCURRENCY,
              load: MachineLoad | None = None) -> list[dict[str, Any]]:
    ctl = http_json("POST", f"{url}/admin/control", {"app": app, "history_rps": history or [window[0]],
                                                      "restart_bins": True}, token=token)
    log(f"[{space}] initial plan: {ctl['plan']['slices_used']} slices for {ctl['predicted_rps']:.1f} rps")
    if load is not None:
        load.sample()
    update, close = _progress_factory(len(window), space, load)
    try:
        # uvloop, as jigsawd runs: the client's one loop sends while thousands of answers come
        # back. social_media's steady peak burst (~2800 in flight) put the asyncio loop 0.29 s
        # behind with the machine otherwise idle, and the uvloop one 0.31 s: one loop is the limit
        import uvloop
        results, settling = uvloop.run(play(url, app, window, split, time_scale, seed, update,
                                            max_concurrency))
    finally:
        close()
    if settling.sent != settling.answered:
        log(f"unmeasured (settling, tail) arrivals without an answer: {settling.sent - settling.answered}")
    deadline = time.monotonic() + 2 * split.period_s + 5  # the daemon closes the last bin
    while True:
        hist = http_json("GET", f"{url}/admin/history?app={app}", token=token).get(app, [])
        if len(hist) >= len(window) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if history_out is not None:
        history_out.write_text(json.dumps(hist, indent=1))
    by_bin = {int(h["bin"]): h for h in hist}
    rows = []
    for k, (rate, r) in enumerate(zip(window, results)):
        h = by_bin.get(k, {})
        p = h.get("plan", {})
        avail = p.get("slices_available") or 0
        rows.append({
            "bin": first_bin + k, "demand_rps": round(rate, 3),
            "predicted_rps": round(h.get("predicted_rps", float("nan")), 3),
            "slices_used_pct": round(100.0 * p["slices_used"] / avail, 2) if avail else float("nan"),
            "accuracy_drop_pct": round(100.0 * (1.0 - p["accuracy"]), 3) if "accuracy" in p else float("nan"),
            "slo_violation_pct": round(r.violation_pct, 3),
            "slo_violation_paper_pct": round(r.violation_paper_pct, 3),
            "p50_ms": round(percentile(r.latencies_ms, 50), 2),
            "p99_ms": round(percentile(r.latencies_ms, 99), 2),
            "sent": r.sent, "answered": r.answered, "violations": r.violations,
            "violations_paper": round(r.violations_paper, 3), "extra_items": round(r.extra_items, 3),
            "shed_503": r.shed_503, "dropped_504": r.dropped_504, "other_failed": r.other_failed,
            "behind": int(r.behind), "behind_s": round(r.behind_s, 3),
            "settle_lost": settling.sent - settling.answered if k == len(window) - 1 else 0,
            "deploy_s": deploy_seconds(h.get("replans", [])),
            "deploy_phases_s": deploy_phases(h.get("replans", [])),
            "replans_kept": kept_replans(h.get("replans", [])),
        })
    return rows


def _deployed(x: Any) -> bool:
    """A plan's record (the controller's ``quick`` or ``exact``) that says it was deployed."""
    return isinstance(x, dict) and bool(x.get("deployed", True)) and "deployed_after_s" in x


def kept_replans(replans: list[dict[str, Any]]) -> int:
    """The re-plans of a bin that pushed a plan and deployed none: every app's running plan served
    on (``outcome`` "kept": the plan refused by the making-room policy, or only pushed again)."""
    def kept(rp: dict[str, Any]) -> bool:
        plans = (rp.get("quick"), rp.get("exact"))
        return not any(_deployed(x) for x in plans) \
            and any(isinstance(x, dict) and x.get("outcome") == "kept" for x in plans)
    return sum(1 for rp in replans if kept(rp))


def deploy_seconds(replans: list[dict[str, Any]]) -> list[list[float]]:
    """Per re-plan of a bin that deployed a plan: the seconds from its decision (the trigger) to
    its first plan's deployment and to its last one's (the quick plan, then the exact one). A plan
    that was kept (nothing changed) is no deployment (``kept_replans``)."""
    out = []
    for rp in replans:
        times = [x["deployed_after_s"] for x in (rp.get("quick"), rp.get("exact")) if _deployed(x)]
        if times:
            out.append([min(times), max(times)])
    return out


def deploy_phases(replans: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per re-plan of a bin that deployed a plan: where the seconds from its decision to its first
    plan's deployment went: the transitions' phases (``applied.PHASES``: placing, MIG, the drains
    waited for, a drain-first, the processes' start, their readiness), ``ahead`` (a routine
    re-plan, decided ahead of its bin, waits for the bin's start: ``ahead_s``), ``solve`` (that
    plan's solve, where the wait for the bin did not hide it) and ``other`` (the rest: the wait
    for the exact plan before a quick one goes out, the re-plan lock)."""
    out = []
    for rp in replans:
        plans = [x for x in (rp.get("quick"), rp.get("exact")) if _deployed(x)]
        if not plans:
            continue
        first = min(plans, key=lambda x: x["deployed_after_s"])
        total = float(first["deployed_after_s"])
        phases = {k: float(v) for k, v in first.get("phases_s", {}).items()}
        left = max(0.0, total - sum(phases.values()))
        ahead = min(float(rp.get("ahead_s", 0.0)), left)
        solve = min(float(first.get("seconds", 0.0)), left - ahead)
        out.append({"total": total, **phases, "ahead": ahead, "solve": solve,
                    "other": max(0.0, left - ahead - solve)})
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    def mean(k: str) -> float:
        xs = [r[k] for r in rows if not math.isnan(r[k])]
        return sum(xs) / len(xs) if xs else float("nan")
    viol = [r["slo_violation_pct"] for r in rows]
    paper = [r["slo_violation_paper_pct"] for r in rows]
    answered = sum(r["answered"] for r in rows)
    extra = sum(r["extra_items"] for r in rows)
    return {"slices_pct": mean("slices_used_pct"), "accuracy_drop_pct": mean("accuracy_drop_pct"),
            # over all requests of the window (the paper's ratio), and per bin (mean, worst)
            "violation_pct": 100.0 * sum(r["violations"] for r in rows) / answered if answered else 0.0,
            "violation_paper_pct": (100.0 * sum(r["violations_paper"] for r in rows) / (answered + extra)
                                    if answered else 0.0),
            "violation_mean_pct": sum(viol) / len(viol) if viol else float("nan"),
            "violation_max_pct": max(viol, default=float("nan")),
            "violation_paper_max_pct": max(paper, default=float("nan")),
            "bins_with_violations": sum(1 for v in viol if v > 0),
            "sent": sum(r["sent"] for r in rows), "answered": answered,
            "settle_lost": sum(r.get("settle_lost", 0) for r in rows),
            "behind_bins": sum(r["behind"] for r in rows),
            "behind_max_s": max((r["behind_s"] for r in rows), default=0.0),
            "replans_kept": sum(r.get("replans_kept", 0) for r in rows),
            **_deploy_summary([d for r in rows for d in r.get("deploy_s", [])]),
            **_phase_summary([d for r in rows for d in r.get("deploy_phases_s", [])])}


def _phase_summary(deploys: list[dict[str, float]]) -> dict[str, Any]:
    """Per phase of the decision-to-deployment time (``deploy_phases``): its median and max over the
    re-plans and its sum, and the slowest re-plan's phases."""
    if not deploys:
        return {"deploy_phases_s": {}, "deploy_slowest_s": {}}
    names = sorted({k for d in deploys for k in d if k != "total"})
    phases = {}
    for k in names:
        xs = sorted(d.get(k, 0.0) for d in deploys)
        phases[k] = {"median": round(statistics.median(xs), 4), "max": round(xs[-1], 4),
                     "sum": round(sum(xs), 3)}
    slowest = max(deploys, key=lambda d: d["total"])
    return {"deploy_phases_s": phases, "deploy_slowest_s": {k: round(v, 4) for k, v in slowest.items()}}


def _deploy_summary(deploys: list[list[float]]) -> dict[str, float]:
    """Decision-to-deployment seconds over the re-plans: median and max of the first plan's and
    of the last plan's (nan without re-plans)."""
    if not deploys:
        return {"replans_deployed": 0, "deploy_first_median_s": math.nan, "deploy_first_max_s": math.nan,
                "deploy_last_median_s": math.nan, "deploy_last_max_s": math.nan}
    first, last = sorted(d[0] for d in deploys), sorted(d[1] for d in deploys)
    return {"replans_deployed": len(deploys), "deploy_first_median_s": statistics.median(first),
            "deploy_first_max_s": first[-1], "deploy_last_median_s": statistics.median(last),
            "deploy_last_max_s": last[-1]}


def print_summary(app: str, summaries: dict[str, dict[str, float]],
                  label: str = "emulated node, modeled profiles") -> None:
    print(f"\n{app}: slices and accuracy are means over the replayed bins; violations are over all "
          f"requests (plain, paper's counting), the bin mean, and the worst bin ({label})")
    print(f"{'space':<6} {'slices %':>9} {'acc drop %':>10} {'viol %':>7} {'paper %':>8} {'bin mean %':>10} "
          f"{'worst bin %':>11} {'bins>0':>6} {'sent':>8} {'answered':>8} {'behind':>6}")
    for space, s in summaries.items():
        print(f"{space:<6} {s['slices_pct']:>9.1f} {s['accuracy_drop_pct']:>10.2f} "
              f"{s['violation_pct']:>7.2f} {s['violation_paper_pct']:>8.2f} {s['violation_mean_pct']:>10.2f} "
              f"{s['violation_paper_max_pct']:>11.2f} {s['bins_with_violations']:>6d} {s['sent']:>8d} "
              f"{s['answered']:>8d} {s['behind_bins']:>6d}")
    print("re-plans: seconds from the decision to the deployment of the first plan (the quick one where "
          "it went out) and of the last, median / max")
    for space, s in summaries.items():
        if s.get("replans_kept"):
            print(f"{space:<6} {s['replans_kept']:>4d} re-plans kept the running plans (nothing deployed)")
        if s.get("replans_deployed"):
            print(f"{space:<6} {s['replans_deployed']:>4d} re-plans deployed: first "
                  f"{s['deploy_first_median_s']:.2f} / {s['deploy_first_max_s']:.2f} s, "
                  f"last {s['deploy_last_median_s']:.2f} / {s['deploy_last_max_s']:.2f} s")
            phases = s.get("deploy_phases_s") or {}
            if phases:
                print(f"{'':<6} where the first plan's time went, median / max / sum s: " + ", ".join(
                    f"{k} {v['median']:.2f} / {v['max']:.2f} / {v['sum']:.1f}" for k, v in phases.items()))
                slow = s["deploy_slowest_s"]
                print(f"{'':<6} the slowest re-plan ({slow['total']:.2f} s): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in slow.items() if k != "total" and v >= 0.005))


def plot(path: Path, app: str, per_space: dict[str, list[dict[str, Any]]],
         label: str = "emulated node, modeled profiles") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no figure (pip install '.[bench]')")
        return
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    first = next(iter(per_space.values()))
    axes[0].plot([r["bin"] for r in first], [r["demand_rps"] for r in first], color="black", label="demand")
    axes[0].set_ylabel("demand (req/s)")
    for space, rows in per_space.items():
        x = [r["bin"] for r in rows]
        axes[0].plot(x, [r["predicted_rps"] for r in rows], linestyle="--", label=f"predicted ({space})")
        axes[1].plot(x, [r["slices_used_pct"] for r in rows], label=space)
        axes[2].plot(x, [r["accuracy_drop_pct"] for r in rows], label=space)
        axes[3].plot(x, [min(50.0, r["slo_violation_paper_pct"]) for r in rows], label=space)
    axes[1].set_ylabel("GPU slices used (%)")
    axes[2].set_ylabel("accuracy drop (%)")
    axes[3].set_ylabel("SLO violations\n(paper's counting, %, cap 50)")
    axes[3].set_xlabel("5-minute bin of the day")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{app}: replay ({label})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/replay.py", description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running jigsawd (its controller must be on)")
    where.add_argument("--node", type=Path, help="start jigsawd on this node file for each space")
    p.add_argument("--capacity-node", type=Path, default=None,
                   help="node file for --scale-to-capacity with --url (default: --node)")
    p.add_argument("--app", required=True)
    p.add_argument("--trace", default="synthetic", help="twitter:PATH | azure:PATH | synthetic[:SEED]")
    p.add_argument("--day", type=int, default=0, help="day of the trace (0-based)")
    p.add_argument("--bins", default=None, help="A:B window of the day's 5-minute bins (default: all 288)")
    p.add_argument("--history-bins", type=int, default=288,
                   help="seed the controller's history with up to this many of the day's bins before the "
                        "window (default 288: all of them, as on a node that has served since the day began; "
                        "the recurring-spike predictor needs earlier spikes to see the next)")
    p.add_argument("--bin-seconds", type=float, default=10.0,
                   help="wall seconds each 5-minute bin is played for (jigsawd's bin length follows)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--scale-to-capacity", action="store_true",
                       help="scale the day's peak to the app's maximum serviceable demand under ast")
    scale.add_argument("--peak-rps", type=float, default=None, help="scale the day's peak to this demand")
    p.add_argument("--capacity-space", default="ast",
                   help="--scale-to-capacity: the search space whose capacity the day's peak is scaled to "
                        "(default ast, the paper's; a narrower space cannot reach ast's capacity)")
    p.add_argument("--spaces", default="ast", help="comma-separated search spaces, run in turn")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="latencies x K and rates / K on both sides (passed to jigsawd)")
    p.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=None,
                   help="start jigsawd with --emulate (default: yes, unless --node is a CPU node whose "
                        "backend, onnxruntime or torch, runs real models here)")
    p.add_argument("--apps", default=None, help="apps jigsawd serves (default: --app)")
    p.add_argument("--token", default=os.environ.get("JIGSAW_ADMIN_TOKEN", ""), help="admin bearer token")
    p.add_argument("--steady-state", action="store_true",
                   help="measure each bin after the node settled: play it --settle-seconds first at its "
                        "rate (not counted; jigsawd's bins are that much longer), as the paper measured")
    p.add_argument("--settle-seconds", type=float, default=None,
                   help="with --steady-state: wall seconds each bin settles (default: --bin-seconds)")
    p.add_argument("--tail-seconds", type=float, default=None,
                   help="with --steady-state: wall seconds each bin plays on at its rate after the measured "
                        "seconds (not counted; jigsawd's bins include them), so the next bin's re-plan "
                        "starts after the measured requests are answered (default: half the SLO x the time "
                        "scale + "
                        f"{TAIL_LEAD_ALLOWANCE_S:g} s; 0: none)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a node setting for jigsawd (TOML value; repeatable), e.g. server.lane_shift=false: "
                        "the ablation's switches; the node file with them is written to --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests the client keeps in flight at most (default: 1.5 x the window's peak rate "
                        "x the app's SLO, at least 512)")
    p.add_argument("--out", type=Path, default=Path("replay-out"))
    return p.parse_args(argv)


def bin_split(args: argparse.Namespace, latency_slo_ms: float) -> BinSplit:
    """The bin's parts from the flags; a ValueError names the bad flag."""
    if not args.steady_state:
        for flag, v in (("--settle-seconds", args.settle_seconds), ("--tail-seconds", args.tail_seconds)):
            if v is not None:
                raise ValueError(f"{flag} needs --steady-state (without it every arrival is measured)")
        return BinSplit(0.0, args.bin_seconds)
    settle_s = args.bin_seconds if args.settle_seconds is None else args.settle_seconds
    tail_s = args.tail_seconds
    if tail_s is None:
        tail_s = default_tail_s(latency_slo_ms, args.time_scale)
    for flag, v in (("--settle-seconds", settle_s), ("--tail-seconds", tail_s)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{flag} must be a finite number >= 0, not {v:g}")
    return BinSplit(settle_s, args.bin_seconds, tail_s)


def daemon_args(node_file: Path, space: str, split: BinSplit, args: argparse.Namespace,
                first_rps: float) -> list[str]:
    """jigsawd's command line: its bins are the whole split period, aligned with the client's bins."""
    return ["--node-config", str(node_file), "--space", space,
            "--bin-seconds", str(split.period_s),
            "--time-scale", str(args.time_scale),
            "--apps", args.apps or args.app, "--demand", f"{max(first_rps, 0.1):.3f}",
            "--seed", str(args.seed)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = missing_runtime() if args.url is None else None  # a running --url daemon needs none here
    if why is not None:
        log(why)
        return 2
    spaces = [s.strip() for s in args.spaces.split(",") if s.strip()]
    bad = [s for s in spaces if s not in SPACES]
    if bad or not spaces:
        log(f"--spaces: unknown space {bad[0] if bad else ''!r} (choose from {', '.join(SPACES)})")
        return 2
    if args.url and len(spaces) > 1:
        log("--spaces with --url: a running jigsawd has one space; use --node to run several")
        return 2
    if args.bin_seconds <= 0 or args.time_scale <= 0:
        log("--bin-seconds and --time-scale must be > 0")
        return 2
    try:
        split = bin_split(args, app_slo_ms(args))
    except ValueError as exc:
        log(str(exc))
        return 2
    peak = args.peak_rps
    if args.capacity_space not in SPACES:
        log(f"--capacity-space: unknown space {args.capacity_space!r} (choose from {', '.join(SPACES)})")
        return 2
    # the settings first: the capacity the window is scaled to is the node's as it will run (a
    # planner.max_utilization below 1 lowers it)
    node_file = args.node
    if args.settings:
        if args.node is None:
            log("--set needs --node (a running jigsawd has its settings)")
            return 2
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            node_file = node_with_settings(args.node, args.settings, args.out)
        except (ValueError, JigsawError) as exc:
            log(str(exc))
            return 2
        log(f"node settings {', '.join(args.settings)} ({node_file})")
    if args.scale_to_capacity:
        node_path = args.capacity_node or node_file
        if node_path is None:
            log("--scale-to-capacity with --url needs --capacity-node N.toml")
            return 2
        t0 = time.monotonic()
        peak = capacity_rps(node_path, args.app, args.capacity_space)
        log(f"{args.app}: capacity under {args.capacity_space} {peak:.1f} rps "
            f"({time.monotonic() - t0:.1f} s to compute)")
    try:
        history, window, first = demand_window(args.trace, args.day, args.bins, peak,
                                               max(1, args.history_bins))
    except TraceError as exc:
        log(str(exc))
        return 2
    if args.emulate is None:
        args.emulate = True
        if args.node is not None:
            from jigsaw.node import load_node
            node = load_node(args.node)
            args.emulate = not (node.gpu.kind == "cpu" and node.backend in ("onnxruntime", "torch"))
    label = "emulated node, modeled profiles" if args.emulate or args.url else "real models on this CPU"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.steady_state:
        tail_from = "--tail-seconds" if args.tail_seconds is not None else (
            f"default: {TAIL_ANSWER_SLO_FRACTION:g} x the SLO x the time scale + {TAIL_LEAD_ALLOWANCE_S:g} s "
            "for the controller's lead")
        log(f"steady state: each bin is {split.describe()} (tail {tail_from})")
    concurrency = args.max_concurrency if args.max_concurrency is not None \
        else client_concurrency(max(window), app_slo_ms(args))
    if concurrency < 1:
        log("--max-concurrency must be >= 1")
        return 2
    log(f"{len(window)} bins from bin {first}, demand {min(window):.1f}..{max(window):.1f} rps, "
        f"{args.bin_seconds:g} s each, time scale {args.time_scale:g}, at most {concurrency} requests "
        "in flight")
    per_space: dict[str, list[dict[str, Any]]] = {}
    loads = {space: MachineLoad() for space in spaces}
    for space in spaces:
        if args.url:
            if split.period_s != args.bin_seconds:
                log(f"--url: the running jigsawd's bins must be {split.period_s:g} s long (its "
                    "--bin-seconds) to stay aligned with the replay's")
            rows = run_space(args.url, args.app, space, window, history, first, split,
                             args.time_scale, args.seed, args.token,
                             args.out / f"{args.app}-{space}-history.json", concurrency, loads[space])
        else:
            with jigsawd(daemon_args(node_file, space, split, args, window[0]),
                         args.out / f"jigsawd-{args.app}-{space}.log", emulate=args.emulate,
                         ready_timeout_s=READY_TIMEOUT_S, cwd=ROOT) as d:
                rows = run_space(d.url, args.app, space, window, history, first, split,
                                 args.time_scale, args.seed, args.token,
                                 args.out / f"{args.app}-{space}-history.json", concurrency,
                                 loads[space])
        per_space[space] = rows
        with open(args.out / f"{args.app}-{space}.csv", "w", newline="") as f:
            # a bin's re-plans' deployment times (a list) stay in the summary, not the flat CSV
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    summaries = {s: summarize(r) for s, r in per_space.items()}
    for space, x in summaries.items():
        x["machine_load"] = loads[space].to_json()
        x.update({"time_scale": args.time_scale, "bin_seconds": args.bin_seconds,
                  "settle_seconds": split.settle_s, "tail_seconds": split.tail_s,
                  "bin_split": split.to_json(),
                  "settings": list(args.settings), "first_bin": first, "bins": len(window)})
    print_summary(args.app, summaries, label)
    worst_late = max(x["behind_max_s"] for x in summaries.values())
    kept = "kept up" if worst_late <= BEHIND_THRESHOLD_S else "FELL BEHIND"
    print(f"time scale {args.time_scale:g}, {args.bin_seconds:g} s bins"
          f"{f' (each {split.describe()})' if args.steady_state else ''}: the client's latest arrival was "
          f"{worst_late:.3f} s behind its schedule ({kept}"
          f", threshold {BEHIND_THRESHOLD_S} s)")
    for space, load in loads.items():
        print(f"{space}: {load.describe()}")
    (args.out / f"{args.app}-summary.json").write_text(json.dumps(summaries, indent=1))
    plot(args.out / f"{args.app}-fig4.png", args.app, per_space, label)
    failed = False
    lost = {s: x["sent"] - x["answered"] + x["settle_lost"] for s, x in summaries.items()
            if x["sent"] != x["answered"] or x["settle_lost"]}
    if lost:
        log(f"requests without an answer: {lost}")
        failed = True
    behind = {s: (x["behind_bins"], round(x["behind_max_s"], 2)) for s, x in summaries.items()
              if x["behind_bins"]}
    if behind:
        log(f"the client fell behind its schedule (space: (bins, worst seconds late)): {behind}; the "
            "load it measured is gentler than the trace's: raise --time-scale or --bin-seconds")
        failed = True
    return 1 if failed else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM too stops the jigsawd it started
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
