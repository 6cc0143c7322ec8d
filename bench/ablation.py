"""The SLO ablation: replay the trace with each mechanism of the node off in turn, and tabulate it.

    python bench/ablation.py [--trace twitter:../shared/data/twitter/workload.tbz2 | synthetic]
        [--only 'traffic_analysis/ast/peak/*'] [--bin-seconds 5] [--time-scale traffic_analysis=20]
        [--out out/ablation] [--readme bench/README.md] [--dry-run] [--ast-capacity]

The matrix (issue "hold the SLO through a real day's bursts"): for each example app of
``examples/h100x4.toml`` the full day 0 (288 bins) under ``ast``; the peak (bins 96:144) and
trough (180:228) windows under ``ast``, ``as``, ``at`` and ``st``; the peak window under ``ast``
with each mechanism off in turn (``MECHANISMS``: its node setting through ``bench/replay.py
--set``) and with all of them off (``none``), and under ``--steady-state`` (``steady``: each bin
first played a bin unmeasured; ``steady_15s``: 15 s, ``STEADY_SETTLE_S``). Every run is one
``bench/replay.py`` process (``--scale-to-capacity``: the day's peak is the app's maximum
serviceable demand under ``ast``; a run under another space scales it to that space's own
capacity unless ``--ast-capacity``: ``st`` cannot reach ``ast``'s; the node's burst floor,
``control.burst_requests``, is then scaled by the same factor, ``scaled_burst_requests``); its
summary lands in ``--out/<run>/`` and one line of ``--out/results.jsonl``. A run already in
``results.jsonl`` is not run again (delete the line to redo it), so the matrix can be run
piecewise: it takes many hours at ``--bin-seconds 5`` (a full day is 24 minutes of replay per
run, plus starting jigsawd). ``--only`` picks runs by glob on their ids (``app/space/window/variant``);
``--dry-run`` lists them with their wall time.

After every run the table between the ablation markers of ``--readme`` is rewritten from
``results.jsonl``: per run, slices % of available, accuracy drop %, SLO violations (plain and the
paper's counting, over all requests; the worst bin), bins with violations, sent == answered,
whether the client kept its schedule (a replay whose client fell behind measured a gentler
load than the trace's and is marked; with the most the machine's 1-minute load average reached
during the run, since replays side by side on a small machine slow the emulated node's
workers and solver) and the code it ran (the commit, ``+changes`` where the
tree differed from it; ``unrecorded`` for rows measured before runs recorded it). Runs measured
nowhere are named in one line under the table, per window, not given a row each.
Results on this node are emulated (modeled profiles); the time scale of each app is printed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout (a worktree one level deeper finds it one level up)
TWITTER = next((d / "shared" / "data" / "twitter" / "workload.tbz2" for d in (ROOT.parent, ROOT.parent.parent)
                if (d / "shared" / "data" / "twitter" / "workload.tbz2").exists()),
               ROOT.parent / "shared" / "data" / "twitter" / "workload.tbz2")
APPS = ("traffic_analysis", "social_media", "ar_assistant")
WINDOWS = {"day": None, "peak": "96:144", "trough": "180:228"}
# mechanism -> the node setting that turns it off
MECHANISMS = {
    "lane_shift": "server.lane_shift=false",
    "burst_floor": "control.burst_requests=0",
    "spike_predictor": "control.predictor=mean",
    "rate_replan": "control.replan_on_rate=false",
    # a drain-first waits for its running generation's unanswered requests the whole SLO, not a share
    "short_drain_first": "control.drain_wait_slo=1",
    # a needed plan the making-room policy refused (a drain-first with no lane left, slots of
    # drains) is followed by the re-plan's quick plan, which keeps the running instances
    "quick_after_refusal": "control.quick_after_refusal=false",
    # a solve that overruns its limit is killed after a bin of grace, not 30 s
    "solver_grace_bins": "control.solver_grace_bins=0",
    # a re-plan that finds no plan at all (near the node's capacity) is asked again at 85% of its demand
    "unplanned_retry": "control.unplanned_retry_share=0",
    # a running plan that holds its demand is kept against a plan of as many slices or more
    "equal_slices_kept": "control.shrink_min_slices=0",
    # the rate trigger may re-plan a second time in a bin, against the plan the first one deployed
    "second_rate_replan": "control.early_replans_per_bin=1",
    # a spike whose free MIG slots all drain gets the running plan extended over the slots that
    # only drain (it waits for those drains) instead of the exact plan's drain-first
    "over_draining": "control.extend_over_draining=false",
    # a running plan that holds its demand, whose smaller plan needs its slots, gives back the
    # instances the demand leaves spare (every process kept, no drain-first)
    "trim": "control.trim_min_slices=0",
    # an app whose plans were refused (no lane left while its small plan drains) gets its running
    # plan extended in place for the share of the demand that packs beside what runs
    "in_place_extension": "control.extend_in_place_after_refusal=false",
    # a needed plan goes on slots nothing runs or drains on when it fits there (no drain waited for)
    "needed_beside": "control.place_needed_beside=false",
    # a spike's plan that needs slots that run or drain goes out as the running plan extended in
    # place at once, not after its refusal
    "in_place_first": "control.extend_in_place_first_below=0",
    # the plan's admission limit counts only the current generation's requests (a previous
    # generation's backlog does not shed new requests at the door)
    "generation_admission": "server.admission_per_generation=false",
    # a request over the in-flight limit is shed only when the work queued ahead of it on its lane
    # leaves no time for its deadline (the count alone sheds requests that would have made it)
    "queue_admission": "server.admission_backlog=false",
    # a plan that does not hold the demand either (at the node's capacity) and would wait for slots
    # that run or drain replaces the running plan only when it plans 10% more
    "short_plan_gain": "control.short_plan_min_gain=0",
    # an instance added to a running plan (a spike's quick plan, the in-place extension) is priced
    # per MIG memory slot it holds too, so the extensions leave memory slots for the next one
    "slot_priced_extension": "planner.extension_slices_per_slot=0",
    # a plan's new MIG instances go where they strand the fewest other compute slices (a GPU whose
    # memory slots run out leaves its free slices unusable), first fit among equals
    "usable_placement": "control.keep_compute_usable=false",
    # a needed plan waiting for the drains in its way stops waiting, and changes nothing, once the
    # arrivals are 1.25x what it plans: the re-plan lock goes to a plan sized to the rate
    "outgrown_wait": "control.end_wait_outgrown_above=0",
    # the rate trigger's window grows back within the bin until it holds the 20 arrivals the
    # trigger needs (a low wall-clock rate), and such a window fires only when significant (z = 3)
    "grown_rate_window": "control.rate_window_grow_z=0",
}
# variants off by default: mechanism -> the node setting that turns it on, for the
# ``with_<mechanism>`` runs (the variants replays measured worse left the product with their
# switches: the making-room policy is one, ARCHITECTURE.md)
OPTIONAL = {
    "shrink_hysteresis": "control.shrink_min_slices=2",
    # admission counts the plan's bottleneck task, not only its roots (a chain's later task that
    # lost instances while they drain admits only what it finishes)
    "bottleneck_admission": "server.admission_bottleneck=true",
}
# planner.max_utilization of every run: plan each instance for at most this share of its profiled
# throughput. The planner's 2 x batch latency per task holds only while a task's queue stays
# within a batch; at the profiles' full throughput a fan-out task's queue grows without bound
# (traffic_analysis's cars arrive Poisson(17.8) per frame): under st, plans for 20, 60 and 120
# req/s played at those rates on the emulated node violated 15%, 3% and 10% of their requests,
# at 0.8 none (bench/plan_holds.py; bench/README.md). Recorded per run; --max-utilization 1 for
# the node file's own.
DEFAULT_MAX_UTILIZATION = 0.8
# wall rates are demand / time scale: social_media's capacity is about 4x traffic_analysis's, so its
# client needs a larger scale to keep its schedule on a 2-core machine (at 20 it fell behind; at 30
# its whole day kept its schedule); at 5 the node itself runs short of CPU
DEFAULT_TIME_SCALE = {"traffic_analysis": 20.0, "social_media": 30.0, "ar_assistant": 20.0}
START_OVERHEAD_S = 60.0  # capacity solve + jigsawd start + tail, per run (2-core machine)
# the steady-state variants: variant -> wall seconds each bin is played unmeasured before its
# measured --bin-seconds (None: one bin, the replay's default). A bin's settling must outlast the
# reconfiguration its re-plan starts, or the measured half still holds the transition: on the
# 2-core machine a spike plan's switch and a needed re-plan's wait for drains each took over 12 s,
# longer than a 5 s bin, so ``steady_15s`` settles 15 s
STEADY_SETTLE_S: dict[str, float | None] = {"steady": None, "steady_15s": 15.0}
BEGIN, END = "<!-- ablation:begin -->", "<!-- ablation:end -->"


@dataclass(frozen=True)
class Run:
    app: str
    space: str
    window: str  # a WINDOWS key
    # "all": every default mechanism on; "no_<mechanism>"; "none": all off; "with_<optional>": an
    # optional one on too; a STEADY_SETTLE_S key: --steady-state
    variant: str

    @property
    def id(self) -> str:
        return f"{self.app}/{self.space}/{self.window}/{self.variant}"

    def settings(self) -> list[str]:
        if self.variant.startswith("no_"):
            return [MECHANISMS[self.variant[3:]]]
        if self.variant.startswith("with_"):
            return [OPTIONAL[self.variant[5:]]]
        if self.variant == "none":
            return list(MECHANISMS.values())
        return []

    def bins(self) -> int:
        spec = WINDOWS[self.window]
        if spec is None:
            return 288
        a, b = (int(x) for x in spec.split(":"))
        return b - a


def matrix(apps: tuple[str, ...] = APPS) -> list[Run]:
    """Every run, in the order of priority: what the table needs most comes first."""
    runs: list[Run] = []
    for app in apps:
        runs.append(Run(app, "ast", "day", "all"))
        runs.append(Run(app, "ast", "peak", "all"))
        runs += [Run(app, "ast", "peak", f"no_{m}") for m in MECHANISMS]
        runs.append(Run(app, "ast", "peak", "none"))
        runs += [Run(app, "ast", "peak", f"with_{m}") for m in OPTIONAL]
        runs += [Run(app, "ast", "peak", v) for v in STEADY_SETTLE_S]
    for app in apps:
        runs.append(Run(app, "ast", "trough", "all"))
        for space in ("as", "at", "st"):
            runs += [Run(app, space, "peak", "all"), Run(app, space, "trough", "all")]
    for app in apps:
        runs.append(Run(app, "ast", "day", "none"))
        runs.append(Run(app, "ast", "day", "steady"))
    return runs


def settle_s(run: Run, bin_seconds: float) -> float:
    """Wall seconds each bin of ``run`` is played unmeasured first (0: not a steady-state run)."""
    if run.variant not in STEADY_SETTLE_S:
        return 0.0
    settle = STEADY_SETTLE_S[run.variant]
    return bin_seconds if settle is None else settle


def tail_s(run: Run, time_scale: float, latency_slo_ms: float) -> float:
    """Wall seconds each bin of ``run`` is played unmeasured after its measured seconds: replay's
    default tail for a steady-state run (0 otherwise)."""
    if run.variant not in STEADY_SETTLE_S:
        return 0.0
    from replay import default_tail_s
    return default_tail_s(latency_slo_ms, time_scale)


def wall_s(run: Run, bin_seconds: float, tail: float = 0.0) -> float:
    """About how long ``run`` takes: its bins' settling, measured seconds and ``tail`` (``tail_s``)."""
    return run.bins() * (bin_seconds + settle_s(run, bin_seconds) + tail) + START_OVERHEAD_S


def app_slos_ms() -> dict[str, float]:
    """Each example app's latency SLO, from the node file the runs use."""
    from jigsaw.node import load_node
    return {a.name: a.latency_slo_ms for a in load_node(ROOT / "examples" / "h100x4.toml").apps}


def scaled_burst_requests(burst_requests: int, capacity_rps: float, ast_capacity_rps: float) -> int:
    """The node's burst floor (``control.burst_requests``) for a space whose window is scaled to its
    own capacity: scaled by the same factor as the window, at least 1 where it was on.

    Why: the floor plans every plan for ``burst_requests`` concurrent requests in half the SLO
    (40 on traffic_analysis: 123 rps), 6% of ast's capacity but all of st's (122.7 rps). Unscaled,
    every re-plan under st asked for the whole node, and each was refused (the one lane would have
    had no instance left while the running ones drained): the trough ran its first bin's 7-slice
    plan for 23 rps through demand up to 108 rps (59% violations).
    """
    if burst_requests <= 0 or ast_capacity_rps <= 0:
        return burst_requests
    return max(1, round(burst_requests * min(1.0, capacity_rps / ast_capacity_rps)))


def replay_args(run: Run, trace: str, bin_seconds: float, time_scale: float, out: Path,
                per_space_capacity: bool = True, burst_requests: int | None = None,
                max_utilization: float | None = None) -> list[str]:
    """The ``bench/replay.py`` command of ``run``; ``per_space_capacity``: a space other than ast
    plays the trace scaled to its own capacity (``--capacity-space``), else to ast's;
    ``burst_requests``: the node's burst floor for this run (``scaled_burst_requests``; None: the
    node's own); ``max_utilization``: ``planner.max_utilization`` (None: the node's own)."""
    node = str(ROOT / "examples" / "h100x4.toml")
    args = [sys.executable, str(ROOT / "bench" / "replay.py"), "--node", node,
            "--app", run.app, "--trace", trace, "--day", "0", "--scale-to-capacity", "--spaces", run.space,
            "--bin-seconds", f"{bin_seconds:g}", "--time-scale", f"{time_scale:g}", "--out", str(out)]
    if WINDOWS[run.window] is not None:
        args += ["--bins", str(WINDOWS[run.window])]
    if run.space != "ast" and per_space_capacity:
        # each space's window scaled to that space's own capacity: a trace scaled to ast's capacity
        # is more than st can serve at any plan (every bin violated), which measures nothing
        args += ["--capacity-space", run.space]
    if run.variant in STEADY_SETTLE_S:
        args.append("--steady-state")
        if STEADY_SETTLE_S[run.variant] is not None:
            args += ["--settle-seconds", f"{STEADY_SETTLE_S[run.variant]:g}"]
    settings = run.settings()
    if burst_requests is not None and not any(x.startswith("control.burst_requests=") for x in settings):
        settings = [*settings, f"control.burst_requests={burst_requests}"]
    if max_utilization is not None:
        setting = f"planner.max_utilization={max_utilization:g}"
        settings = [*settings, setting]
        # the window is scaled to the capacity the plans are made for (at this utilization)
        from replay import node_with_settings
        args += ["--capacity-node", str(node_with_settings(Path(node), [setting], out / "capacity-node"))]
    for s in settings:
        args += ["--set", s]
    return args


def run_burst_requests(run: Run, per_space_capacity: bool, cache: dict[tuple[str, str], float]) -> int | None:
    """The burst floor of ``run``: the node's, scaled for a space played at its own capacity (None:
    the node's own, unchanged)."""
    if run.space == "ast" or not per_space_capacity:
        return None
    from replay import capacity_rps

    from jigsaw.node import load_node
    node_path = ROOT / "examples" / "h100x4.toml"
    for space in ("ast", run.space):
        if (run.app, space) not in cache:
            cache[(run.app, space)] = capacity_rps(node_path, run.app, space)
    base = load_node(node_path).control.burst_requests
    return scaled_burst_requests(base, cache[(run.app, run.space)], cache[(run.app, "ast")])


def code_version(root: Path = ROOT) -> str:
    """The commit the runs measure (short hash), ``+changes`` where the node's code differs from it:
    a table row is evidence for the code that made it, and rows of several commits sit side by side
    (a run already in ``results.jsonl`` is not run again). ``unknown`` outside a git checkout."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src", "bench",
                                "examples", "profiles", "native"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+changes" if dirty else sha


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out[d["id"]] = d
    return out


def _pct(x: Any, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


# the table's columns; "code": the commit the run measured (``code_version``)
COLUMNS = ("app", "space", "bins", "variant", "slices %", "acc drop %", "viol %", "paper %", "worst bin %",
           "bins > 0", "sent = answered", "client", "time scale", "code")


def readme_rows(readme: Path) -> dict[str, str]:
    """The measured rows of the table already in ``readme``, by run id: a run whose result is not in
    this ``results.jsonl`` (measured elsewhere, another ``--out``) keeps its row."""
    doc = readme.read_text() if readme.exists() else ""
    if BEGIN not in doc or END not in doc:
        return {}
    windows = {spec or "0:288": w for w, spec in WINDOWS.items()}
    rows: dict[str, str] = {}
    for line in doc[doc.index(BEGIN):doc.index(END)].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[4] in ("not run", "slices %") or cells[2] not in windows:
            continue
        if len(cells) == len(COLUMNS) - 1:  # a row from before the code column: its code is not known
            cells.append("unrecorded")
        rows[Run(cells[0], cells[1].split()[0], windows[cells[2]], cells[3].split()[0]).id] = \
            "| " + " | ".join(cells) + " |"
    return rows


def table(runs: list[Run], results: dict[str, dict[str, Any]], kept: dict[str, str] | None = None) -> str:
    """The markdown table of ``runs``: a run in ``results`` from it, else its row in ``kept``
    (``readme_rows``); the runs in neither are named under the table ("Not run: ..."), per app,
    space and window, so that the table holds only measurements."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    missing: dict[str, list[str]] = {}
    for run in runs:
        r = results.get(run.id)
        bins = WINDOWS[run.window] or "0:288"
        if r is None:
            row = (kept or {}).get(run.id)
            if row is None:
                missing.setdefault(f"{run.app} {run.space} {bins}", []).append(run.variant)
            else:
                lines.append(row)
            continue
        s = r["summary"]
        same = "yes" if s["sent"] == s["answered"] and not s.get("settle_lost") else \
            f"no ({s['sent']} / {s['answered']})"
        client = "kept up" if not s["behind_bins"] else f"behind in {s['behind_bins']} bins"
        client += machine_load_note(s.get("machine_load"))
        scaled = r.get("capacity_space", "ast")
        space = run.space if scaled == "ast" else f"{run.space} (its capacity)"
        util = r.get("max_utilization")
        variant = run.variant if util is None or util >= 1 else f"{run.variant} (max util {util:g})"
        lines.append(f"| {run.app} | {space} | {bins} | {variant} | {_pct(s['slices_pct'], 1)} | "
                     f"{_pct(s['accuracy_drop_pct'])} | {_pct(s['violation_pct'])} | "
                     f"{_pct(s['violation_paper_pct'])} | {_pct(s['violation_paper_max_pct'])} | "
                     f"{s['bins_with_violations']} | {same} ({s['sent']}) | {client} | {r['time_scale']:g} | "
                     f"{r.get('commit', 'unrecorded')} |")
    if missing:
        lines.append("")
        lines.append("Not run: " + "; ".join(f"{where}: {', '.join(variants)}"
                                               for where, variants in missing.items()) + ".")
    return "\n".join(lines)


def machine_load_note(load: dict[str, Any] | None) -> str:
    """The table's note on how loaded the machine was during a run (``replay.MachineLoad``): its
    1-minute load average's max over the run against the CPUs; empty for runs that predate it."""
    if not load or load.get("load_1m_max") is None:
        return ""
    return f", load {load['load_1m_max']:.1f} of {load['cpus']} CPUs"


# the paper's Fig. 4 (d)-(f): its low-demand, high-demand and whole-day aggregates, per space
FIGURE_WINDOWS = (("trough", "low (bins 180:228)"), ("peak", "high (bins 96:144)"), ("day", "whole day"))
FIGURE_SPACES = ("ast", "as", "at", "st")
FIGURE_METRICS = (("slices_pct", "GPU slices used (%)"), ("accuracy_drop_pct", "accuracy drop (%)"),
                  ("violation_paper_pct", "SLO violations (%, paper's counting)"))
HATCH_VIOLATION_PCT = 10.0  # the paper hatches a bar whose window violated at least this share


def figure_cells(results: dict[str, dict[str, Any]],
                 app: str) -> dict[tuple[str, str], dict[str, Any] | None]:
    """Fig. 4 (d)-(f)'s bars of ``app``: per (window, space), the summary of its ``all`` run (every
    default mechanism on), or None where that run is not in ``results`` (drawn as "not run": a
    window is never cut out of another run or filled in)."""
    return {(w, space): (results.get(Run(app, space, w, "all").id) or {}).get("summary")
            for w, _ in FIGURE_WINDOWS for space in FIGURE_SPACES}


def hatched(summary: dict[str, Any]) -> bool:
    """The paper hatches a bar whose run violated the SLO for at least 10% of its requests."""
    return summary["violation_paper_pct"] >= HATCH_VIOLATION_PCT


def draw_figures(results: dict[str, dict[str, Any]], out_dir: Path, runs_dir: Path,
                 apps: tuple[str, ...] = APPS) -> list[Path]:
    """Per app, the bar chart of the paper's Fig. 4 (d)-(f) (``<app>-fig4-bars.png``: slices %,
    accuracy drop % and violations per space over the low, high and whole-day windows, hatched
    where violations >= 10%) and, where its full-day ``ast`` run is in ``runs_dir``, that run's
    per-bin chart as ``bench/replay.py`` drew it (``<app>-fig4-day.png``, (a)-(c)). Returns the
    files written."""
    import shutil

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    width = 0.8 / len(FIGURE_SPACES)
    for app in apps:
        if not any(r.startswith(f"{app}/") for r in results):
            continue  # nothing of it measured under this --out: no figure of only "not run"
        cells = figure_cells(results, app)
        fig, axes = plt.subplots(1, len(FIGURE_METRICS), figsize=(12, 3.6))
        for ax, (metric, label) in zip(axes, FIGURE_METRICS):
            top = max((c[metric] for c in cells.values() if c is not None), default=1.0) or 1.0
            for i, space in enumerate(FIGURE_SPACES):
                for k, (window, _) in enumerate(FIGURE_WINDOWS):
                    x = k - 0.4 + width * (i + 0.5)
                    cell = cells[(window, space)]
                    if cell is None:
                        ax.text(x, 0.02 * top, "not run", rotation=90, ha="center", va="bottom",
                                fontsize=6, color="grey")
                        continue
                    hatch = "//" if hatched(cell) else None
                    ax.bar(x, cell[metric], width, color=f"C{i}", hatch=hatch, edgecolor="black",
                           linewidth=0.5)
                    # "*": the run's client fell behind its schedule (a gentler load: not evidence)
                    mark = "*" if cell.get("behind_bins") else ""
                    ax.text(x, cell[metric], f"{cell[metric]:.1f}{mark}", ha="center", va="bottom",
                            fontsize=6)
            ax.set_xticks(range(len(FIGURE_WINDOWS)), [w for _, w in FIGURE_WINDOWS], fontsize=8)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(FIGURE_SPACES))]
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="//"))
        fig.legend(handles, [*FIGURE_SPACES, f"violations >= {HATCH_VIOLATION_PCT:g}%"], loc="upper right",
                   fontsize=8, ncol=len(handles))
        fig.suptitle(f"{app}: each space's default run (emulated node, modeled profiles; "
                     "* the client fell behind: not evidence)", fontsize=9, x=0.01, ha="left")
        fig.tight_layout(rect=(0, 0, 1, 0.92))
        path = out_dir / f"{app}-fig4-bars.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
        day = runs_dir / Run(app, "ast", "day", "all").id.replace("/", "-") / f"{app}-fig4.png"
        if day.exists():
            written.append(Path(shutil.copyfile(day, out_dir / f"{app}-fig4-day.png")))
    return written


def write_readme(readme: Path, text: str) -> None:
    """Rewrite the table between the markers of ``readme`` (a new file holds just the table)."""
    doc = readme.read_text() if readme.exists() else ""
    if BEGIN not in doc or END not in doc:
        doc = doc.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    a = doc.index(BEGIN) + len(BEGIN)
    b = doc.index(END)
    readme.write_text(doc[:a] + "\n" + text + "\n" + doc[b:])


def parse_time_scales(spec: list[str]) -> dict[str, float]:
    scales = dict(DEFAULT_TIME_SCALE)
    for item in spec:
        app, sep, k = item.partition("=")
        try:
            value = float(k)
        except ValueError:
            value = -1.0
        if not sep or app not in APPS or value <= 0:
            raise SystemExit(f"ablation: --time-scale {item!r}: expected APP=K with APP one of "
                             f"{', '.join(APPS)} and K > 0")
        scales[app] = value
    return scales


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/ablation.py", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=f"twitter:{TWITTER}" if TWITTER.exists() else "synthetic",
                   help="the trace (default: the Twitter trace in ../shared/data when present, else the "
                        "project's synthetic one)")
    p.add_argument("--only", action="append", default=[], help="glob on run ids app/space/window/variant")
    p.add_argument("--bin-seconds", type=float, default=5.0)
    p.add_argument("--time-scale", action="append", default=[], metavar="APP=K",
                   help=f"per-app time scale (default {DEFAULT_TIME_SCALE})")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "ablation")
    p.add_argument("--readme", type=Path, default=ROOT / "bench" / "README.md")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their wall time; run nothing")
    p.add_argument("--max-utilization", type=float, default=DEFAULT_MAX_UTILIZATION,
                   help=f"planner.max_utilization of every run (default {DEFAULT_MAX_UTILIZATION:g}; "
                        "1: the profiles' full throughput)")
    p.add_argument("--ast-capacity", action="store_true",
                   help="scale every space's window to ast's capacity (default: each space to its own)")
    p.add_argument("--figures", type=Path, metavar="DIR",
                   help="draw the paper's Fig. 4 per app from results.jsonl into DIR (the bars (d)-(f) and "
                        "the full day's per-bin chart) and run nothing")
    args = p.parse_args(argv)
    if not args.readme.parent.is_dir():
        raise SystemExit(f"ablation: --readme {args.readme}: its directory does not exist")
    scales = parse_time_scales(args.time_scale)
    if not 0 < args.max_utilization <= 1:
        raise SystemExit(f"ablation: --max-utilization {args.max_utilization:g}: expected 0 < U <= 1")
    runs = [r for r in matrix() if not args.only or any(fnmatch.fnmatch(r.id, g) for g in args.only)]
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.jsonl"
    results = load_results(results_path)
    todo = [r for r in runs if r.id not in results]
    slos_ms = app_slos_ms()

    def run_wall_s(r: Run) -> float:
        return wall_s(r, args.bin_seconds, tail_s(r, scales[r.app], slos_ms[r.app]))

    total_s = sum(run_wall_s(r) for r in todo)
    print(f"ablation: {len(runs)} runs selected, {len(todo)} to run, about {total_s / 3600:.1f} h at "
          f"{args.bin_seconds:g} s bins; trace {args.trace}; time scales {scales}", flush=True)
    capacities: dict[tuple[str, str], float] = {}
    if args.figures is not None:
        for path in draw_figures(results, args.figures, args.out):
            print(f"ablation: wrote {path}")
        return 0
    if args.dry_run:
        for r in todo:
            cmd = replay_args(r, args.trace, args.bin_seconds, scales[r.app], args.out / "x",
                              not args.ast_capacity, run_burst_requests(r, not args.ast_capacity, capacities),
                              args.max_utilization)
            print(f"  {r.id:<50} {run_wall_s(r) / 60:6.1f} min  {' '.join(cmd)}")
        return 0
    failed = 0
    for r in todo:
        out = args.out / r.id.replace("/", "-")
        cmd = replay_args(r, args.trace, args.bin_seconds, scales[r.app], out, not args.ast_capacity,
                          run_burst_requests(r, not args.ast_capacity, capacities), args.max_utilization)
        print(f"ablation: {r.id} (time scale {scales[r.app]:g}): {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        commit = code_version()  # each replay imports the code afresh: read it per run
        with open(args.out / f"{r.id.replace('/', '-')}.log", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        summary_path = out / f"{r.app}-summary.json"
        if not summary_path.exists():
            print(f"ablation: {r.id}: replay exited {rc} without a summary (see its log)", flush=True)
            failed += 1
            continue
        summary = json.loads(summary_path.read_text())[r.space]
        record = {"id": r.id, "rc": rc, "time_scale": scales[r.app], "bin_seconds": args.bin_seconds,
                  "trace": args.trace, "wall_s": round(time.monotonic() - t0, 1), "summary": summary,
                  "capacity_space": "ast" if args.ast_capacity else r.space,
                  "max_utilization": args.max_utilization, "commit": commit}
        with open(results_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        results[r.id] = record
        print(f"ablation: {r.id}: rc {rc}, slices {summary['slices_pct']:.1f}%, violations "
              f"{summary['violation_paper_pct']:.2f}% (paper's), worst bin "
              f"{summary['violation_paper_max_pct']:.2f}%" + (
                  f", re-plan decision to deployment: first {summary['deploy_first_median_s']:.2f} / "
                  f"{summary['deploy_first_max_s']:.2f} s, last {summary['deploy_last_median_s']:.2f} / "
                  f"{summary['deploy_last_max_s']:.2f} s (median / max)"
                  if summary.get("replans_deployed") else "") + (
                  f", {summary['replans_kept']} re-plans kept the running plans"
                  if summary.get("replans_kept") else ""), flush=True)
        write_readme(args.readme, table(matrix(), results, readme_rows(args.readme)))
    write_readme(args.readme, table(matrix(), results, readme_rows(args.readme)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
