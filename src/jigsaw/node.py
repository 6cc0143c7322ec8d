"""The node model: GPUs and how they may be partitioned, planner settings, server limits, apps.

Loaded from a node TOML file (``examples/h100x4.toml``). Relative paths in it are relative to
the file. Every setting has the paper's value as its default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator

from jigsaw.app import App, load_app
from jigsaw.errors import ConfigError
from jigsaw.fields import Fields, load_section, read_toml, reference, section, setting
from jigsaw.gpu_groups import BACKENDS as BACKENDS
from jigsaw.gpu_groups import (
    MIG_FIGURE_KEYS,
    PAPER_BATCH_SIZES,
    WHOLE_GPU_KEYS,
    GpuGroup,
    composite_model,
    group_of_gpu,
    groups_reference,
    load_gpu_groups,
    qualified,
)
from jigsaw.mig import GpuModel, MigProfile
from jigsaw.profiles import ProfileTable, check_coverage, load_profiles
from jigsaw.shares import with_share_rows

__all__ = ["BACKENDS", "MIG_FIGURE_KEYS", "PAPER_BATCH_SIZES", "WHOLE_GPU_KEYS", "Node", "load_node",
           "load_node_profiles", "settings_reference"]
PAPER_BETA_SLICES = 28  # the paper's beta = 0.035 was chosen for a 28-slice node
PAPER_BETA = 0.035
Objective = Literal["accuracy", "slices"]
HttpFront = Literal["fast", "aiohttp"]
Predictor = Literal["profile", "mean"]  # spike-aware (control/predictor.py) or the paper's mean
NODE_OBJECTIVES: tuple[str, ...] = get_args(Objective)
HTTP_FRONTS: tuple[str, ...] = get_args(HttpFront)
PREDICTORS: tuple[str, ...] = get_args(Predictor)


@dataclass(frozen=True)
class SegmentType:
    """A GPU segment: a MIG instance (or whole GPU) running ``mps`` identical MPS processes, or
    one process of an MPS share of a whole GPU (``mps`` 1, ``jigsaw.shares``)."""

    mig: MigProfile
    mps: int

    @property
    def slices(self) -> int:
        return self.mig.compute_slices

    @property
    def name(self) -> str:
        return f"{self.mig.name}x{self.mps}"


def _known_space(name: str) -> str:
    from jigsaw.spaces import SPACES
    if name not in SPACES:
        raise ValueError(f"expected one of {', '.join(SPACES)}, got {name!r}")
    return name


def _weights(table: Any) -> Any:
    """``app_weights = {app = weight}`` -> ((app, weight), ...) sorted by app."""
    if not isinstance(table, dict):
        return table
    for name, weight in table.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"app_weights.{name}: expected a number >= 0, got {weight!r}")
    return tuple((name, float(table[name])) for name in sorted(table))


def _off_or_at_least_one(x: float) -> float:
    if 0 < x < 1:
        raise ValueError(f"expected 0 (off) or a number >= 1, got {x!r}")
    return x


@section
class PlannerSettings:
    """``[planner]``: what the MILP plans for and how long it may search."""

    accuracy_slo: float = setting(0.9, "fraction of the best end-to-end accuracy a plan must keep",
                                  gt=0, le=1)
    demand_slack: float = setting(0.05, "share added to the predicted demand before planning",
                                  ge=0, le=10)
    alpha: float = setting(1.0, "weight of accuracy in the objective", ge=0)
    beta: float | None = setting(None, "cost of one compute slice in the objective (default: "
                                       "0.035 x 28 / the node's slices, the paper's scale)", ge=0)
    hop_latency_ms: float = setting(10.0, "communication latency per hop, added to the SLO per "
                                          "path depth", ge=0)
    time_limit_s: float = setting(10.0, "the solver's time limit per plan", gt=0)
    absolute_gap: float | None = setting(None, "the solver's stopping gap in accuracy units "
                                               "(default: half of beta)", ge=0)
    solver: Literal["cbc", "highs"] = setting("cbc", "the MILP solver")
    space: Annotated[str, AfterValidator(_known_space)] = setting(
        "ast", "search space of the paper's ablation (unopt a s t as at st ast)")
    max_utilization: float = setting(1.0, "share of its profiled throughput an instance is "
                                           "planned to carry", gt=0, le=1)
    objective: Objective = setting(
        "accuracy", "node-wide plan: weighted accuracy minus beta per slice, or the fewest "
                    "slices that serve every app")
    app_weights: Annotated[tuple[tuple[str, float], ...], BeforeValidator(_weights)] = setting(
        (), "per-app weights of the \"accuracy\" objective, a table app = weight (default 1)",
        strict=False, toml_type="table")
    formulation: Literal["tight", "reference"] = setting(
        "tight", "the MILP's formulation (\"reference\": the original single MILP, kept to "
                 "check against)")
    extension_slices_per_slot: float = setting(
        0.875, "compute slices an instance added to a running plan costs per MIG memory slot "
               "it holds (0: compute slices alone)", ge=0, le=7)
    precompute_step_s: float = setting(
        4.0, "the solver process's idle time: each app's capacity per slice budget, one solve of "
             "at most this long each, at the lowest CPU priority (0: none)", ge=0)

    def app_weight(self, app: str) -> float:
        return dict(self.app_weights).get(app, 1.0)


@section
class ServerSettings:
    """``[server]``: the front end's limits and the data plane's mechanisms."""

    host: str = setting("127.0.0.1", "address the HTTP front end binds", min_length=1)
    port: int = setting(8000, "port of the HTTP front end (0: any free port)", ge=0, le=65535)
    max_payload_bytes: int = setting(16 * 1024 * 1024, "largest request body accepted",
                                     ge=1024)
    max_queue: int = setting(4096, "requests admitted but not answered, per app", ge=1)
    ring_slots: int = setting(1024, "slots of each shared-memory ring", ge=2, le=1 << 20)
    ring_slot_bytes: int = setting(64 * 1024, "bytes of each ring slot", ge=256, le=1 << 30)
    worker_hang_timeout_s: float = setting(3.0, "a worker whose loop has not turned this long "
                                                "is hung", ge=0.5)
    worker_max_restarts: int = setting(3, "restarts of one worker within "
                                          "worker_restart_window_s before giving up", ge=0)
    worker_restart_window_s: float = setting(60.0, "window of worker_max_restarts", gt=0)
    stale_drops: bool = setting(False, "drop an item a full batch passed over that then waited "
                                       "past the app's staleness_ms (the paper's §3.3)")
    lane_shift: bool = setting(True, "a request whose lane is backed up past its share of the "
                                     "SLO takes the lane that finishes it soonest")
    admission_bottleneck: bool = setting(False, "admission counts the plan's bottleneck task's "
                                                "capacity, not only its roots'")
    admission_per_generation: bool = setting(True, "the in-flight limit counts only the "
                                                   "requests of the generation new ones go to")
    admission_backlog: bool = setting(True, "over the in-flight limit, shed only a request "
                                            "whose queue ahead leaves no time for its deadline")
    spare_workers: int = setting(4, "idle, imported worker processes a re-plan hands new "
                                    "processes to (0: off)", ge=0, le=64)
    fork_server: bool = setting(True, "fork worker processes from a server that did their "
                                      "imports once (false: a Python start each)")
    http: HttpFront = setting("fast", "front end: httptools for the hot OIP "
                                                       "routes, or aiohttp for everything")
    header_timeout_s: float = setting(10.0, "a request head must arrive within this of its first byte "
                                            "(408), a connection's first byte within this of its start",
                                      gt=0)
    body_timeout_s: float = setting(30.0, "a request body must arrive within this of its head (408)", gt=0)
    keepalive_timeout_s: float = setting(30.0, "an idle keep-alive connection closes after this", gt=0)
    max_request_line_bytes: int = setting(8190, "a request line's method, URL and version (414)",
                                          ge=64, le=1 << 20)
    max_header_bytes: int = setting(16384, "a request's header lines together (aiohttp: each line) (431)",
                                    ge=256, le=1 << 24)
    max_headers: int = setting(100, "header lines of one request (431)", ge=4, le=10000)
    max_connections: int = setting(4096, "open client connections; at the bound the least recently "
                                         "active one that owes no answer is closed for a new one",
                                   ge=1, le=1 << 20)
    grpc_port: int = setting(8001, "port of Triton's gRPC inference service (KServe v2) on host "
                                   "(0: off)", ge=0, le=65535)



TRIGGERS, PREDICTOR, DEPLOYMENT, ROOM = "triggers", "predictor", "deployment", "making room"


@section
class ControlSettings:
    """``[control]``: when the controller re-plans, what it predicts, how a new plan is deployed,
    and how a plan makes room on slots others hold. Grouped by purpose in the reference."""

    bin_seconds: float = setting(300.0, "length of a demand bin (one routine re-plan each)",
                                 gt=0, group=TRIGGERS)
    replan_violation_rate: float = setting(0.05, "re-plan early when the bin's SLO violations "
                                                 "exceed this share", ge=0, le=1, group=TRIGGERS)
    replan_on_rate: bool = setting(True, "re-plan early when the recent arrival rate exceeds "
                                         "what the plan holds", group=TRIGGERS)
    rate_window_grow_z: float = setting(3.0, "a rate window too sparse to read grows within "
                                             "the bin and fires at this significance (0: no "
                                             "growth)", ge=0, group=TRIGGERS)
    early_replans_per_bin: int = setting(2, "early re-plans one app may trigger per bin", ge=1,
                                         group=TRIGGERS)
    history_bins: int = setting(5, "the predictor's window in bins", ge=1, group=PREDICTOR)
    predictor: Predictor = setting(
        "profile", "the mean outside spikes, a running spike from past spikes' heights, recurring "
                   "jumps foreseen (\"profile\"), or the paper's mean", group=PREDICTOR)
    burst_requests: int = setting(40, "every plan holds this many concurrent requests within "
                                      "half the SLO (0: off)", ge=0, group=PREDICTOR)
    repartition_delay_s: float = setting(2.0, "emulated: time a GPU is unavailable while "
                                              "repartitioned", ge=0, group=DEPLOYMENT)
    shrink_min_slices: int = setting(1, "a running plan that holds its demand is replaced only "
                                        "by one at least this many slices smaller", ge=0,
                                     group=DEPLOYMENT)
    trim_min_slices: int = setting(4, "a running plan that holds its demand gives back spare "
                                      "instances freeing at least this many slices (0: off)",
                                   ge=0, group=DEPLOYMENT)
    quick_after_refusal: bool = setting(True, "a plan refused before anything changed is "
                                              "followed by the re-plan's quick plan",
                                        group=DEPLOYMENT)
    extend_in_place_after_refusal: bool = setting(True, "an app whose needed plan was refused "
                                                        "gets its running plan extended in "
                                                        "place", group=DEPLOYMENT)
    extend_in_place_first_below: float = setting(0.8, "a needed plan that does not fit beside "
                                                      "what runs extends the running plan when "
                                                      "it holds less than this share of the "
                                                      "demand (0: off)", ge=0, le=1,
                                                 group=DEPLOYMENT)
    extend_over_draining: bool = setting(True, "an extension may wait for slots that only "
                                               "drain", group=DEPLOYMENT)
    unplanned_retry_share: float = setting(0.85, "a re-plan that finds no plan is asked again "
                                                 "at this share of the demand (0: not again)",
                                           ge=0, le=1, group=DEPLOYMENT)
    short_plan_min_gain: float = setting(0.1, "a plan short of its demand that would wait for "
                                              "slots replaces the running one only when it "
                                              "plans this share more", ge=0, group=DEPLOYMENT)
    solver_grace_bins: float = setting(1.0, "bins of grace past twice its time limit before a "
                                            "solve is killed (0: a fixed 30 s)", ge=0,
                                       group=DEPLOYMENT)
    place_needed_beside: bool = setting(True, "a needed plan goes beside everything that runs "
                                              "and drains when it fits so", group=ROOM)
    keep_compute_usable: bool = setting(True, "new MIG instances go where they strand the "
                                              "fewest compute slices", group=ROOM)
    drain_wait_slo: float = setting(0.25, "share of the SLO a drain-first waits for the requests "
                                          "of the instances it drains before sending them again",
                                    ge=0, le=1, group=ROOM)
    end_wait_outgrown_above: Annotated[float, AfterValidator(_off_or_at_least_one)] = setting(
        1.25, "a needed plan's wait for the drains in its way ends, changing nothing, when the "
              "arrivals exceed its demand this many times (0: off)", ge=0, group=ROOM)


# [control] keys of older node files -> what replaced them (the loader's error names it). The
# making-room behaviour they switched is now one policy (ARCHITECTURE.md, "The path of a plan"):
# a plan the running one does not need is not worth a drain-first or a wait; a needed plan waits
# for the drains in its way to end (refused at once when its drain-first would leave no lane),
# drains the app's own instances first only past the running plan's headroom and queue, and every
# replaced generation drains until its late credits are settled. Variants replays measured worse
# or no better went with their switches.
_ROOM = "the making-room policy (drain_wait_slo, end_wait_outgrown_above)"
REMOVED_CONTROL: dict[str, str] = {
    "drain_first_wait_slo": "renamed control.drain_wait_slo",
    **{k: f"{_ROOM} does this always" for k in (
        "wait_drains_when_needed", "refuse_before_drain_wait", "recheck_need_before_drain_first",
        "drain_first_past_headroom", "headroom_yields_when_rising", "headroom_weighs_demand",
        "drain_first_within_wait", "drain_late_credits")},
    **{k: f"{_ROOM} never does this (measured worse)" for k in (
        "cut_drains", "cut_drain_max_unanswered", "place_around_busy_drains", "place_around_draining",
        "cut_drains_when_needed", "two_step_drain_first", "queue_yields_past_full",
        "handover_on_needed_switch", "drain_first_when_holding", "shrink_drain_min_slices")},
    "headroom_full_fraction": f"{_ROOM} keeps the running plan up to its full utilization",
    "rate_trigger_z": "control.rate_window_grow_z (a window of enough arrivals fires on the rate alone)",
    "lookahead_bins": "control.predictor (each plan holds the next bin's prediction)",
    "skip_ended_spikes": "control.predictor \"profile\" (its mean always leaves out every spike's bins)",
    "hold_spikes": "control.predictor \"profile\" (a running spike is never predicted below its last bin)",
    "single_reconfiguration": "removed (measured worse): an urgent re-plan deploys its quick plan, "
                              "then its exact one",
    "fewest_starts_first": "removed (measured no better): the exact plan goes out when it is in",
    "keep_new_plan_bins": "control.shrink_min_slices (measured worse: a plan that holds its demand "
                          "is replaced at once)",
}

SECTIONS = (("planner", PlannerSettings), ("server", ServerSettings), ("control", ControlSettings))


def settings_reference() -> str:
    """The node file's settings reference (docs/node-settings.md), generated from the declarations:
    ``python -m jigsaw.node > docs/node-settings.md``."""
    head = ("# Node file settings\n\nGenerated from the declarations in `src/jigsaw/node.py` and "
            "`src/jigsaw/gpu_groups.py` (`python -m jigsaw.node > docs/node-settings.md`); `apps` "
            "is described in README.md.\n")
    return "\n".join([head, groups_reference(), *(reference(cls, name) for name, cls in SECTIONS)])


@dataclass(frozen=True)
class Node:
    name: str
    gpu: GpuModel
    num_gpus: int
    mig_profiles: tuple[str, ...]  # those the planner may use (default: all of the GPU's table)
    mps_levels: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    profiles_dir: Path
    backend: str
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    apps: tuple[App, ...] = ()
    source: str = ""
    # a node of several GPU groups: each group (``jigsaw.gpu_groups``; ``gpu`` is then their
    # composite, ``num_gpus`` all their GPUs); empty for a node of one group, which the fields
    # above describe (``gpu_groups``)
    groups: tuple[GpuGroup, ...] = ()

    @cached_property
    def gpu_groups(self) -> tuple[GpuGroup, ...]:
        """The node's GPU groups (one for a node of one GPU model)."""
        if self.groups:
            return self.groups
        return (GpuGroup(self.gpu.name, self.gpu, self.gpu, self.num_gpus, 0, self.mig_profiles,
                         self.mps_levels, self.batch_sizes, self.profiles_dir, self.backend),)

    @property
    def gpus_text(self) -> str:
        """What the node's GPUs are, for people: ``4x H100-80GB``, ``2x A100-40GB (MIG) + 2x L4
        (whole)``."""
        if not self.is_mixed:
            return f"{self.num_gpus}x {self.gpu.name}"
        return " + ".join(f"{g.count}x {g.name} ({'MIG' if g.model.mig else 'whole'})" for g in self.groups)

    def host_index(self, gpu: int) -> int:
        """The host's GPU index (NVML, ``nvidia-smi -i``) of the node's GPU ``gpu``: the same on a
        node of one group; a group's ``devices`` on a node of several."""
        if not self.is_mixed:
            return gpu
        g = group_of_gpu(self.groups, gpu)
        return g.host_indices[gpu - g.first]

    @property
    def is_mixed(self) -> bool:
        """Several GPU groups (models, or MIG beside whole GPUs) in one node."""
        return len(self.groups) > 1

    @property
    def slices_available(self) -> int:
        return sum(g.slices for g in self.gpu_groups)

    @property
    def segment_types(self) -> tuple[SegmentType, ...]:
        # an MPS share of a whole GPU is one process of its GPU's k (``jigsaw.shares``)
        return tuple(SegmentType(g.gpu.profile(p), k) for g in self.gpu_groups
                     for p in g.mig_profiles for k in g.mps_levels
                     if k == 1 or not g.gpu.profile(p).share_of)

    @property
    def beta(self) -> float:
        if self.planner.beta is not None:
            return self.planner.beta
        return PAPER_BETA * PAPER_BETA_SLICES / max(1, self.slices_available)

    @property
    def absolute_gap(self) -> float:
        """The solvers' stopping gap: ``planner.absolute_gap``, or half a slice's cost (beta / 2).

        A gap below beta cannot hide a plan with fewer slices at the same accuracy, and the
        objective's accuracy term is in [0, 1]: half a slice is 1.75% of the best accuracy on
        the 4-GPU example node.
        """
        if self.planner.absolute_gap is not None:
            return self.planner.absolute_gap
        return 0.5 * self.beta

    def app(self, name: str) -> App:
        for a in self.apps:
            if a.name == name:
                return a
        raise KeyError(name)

    def with_gpus(self, num_gpus: int) -> Node:
        """The same node with another GPU count (capacity studies on hypothetical nodes); a node
        of several groups has no one GPU count to change (ConfigError)."""
        from dataclasses import replace
        if self.is_mixed:
            if num_gpus == self.num_gpus:
                return self
            raise ConfigError(self.source or self.name, "gpus",
                              f"{len(self.groups)} GPU groups: a GPU count ({num_gpus}) does not "
                              "apply; change each group's count")
        return replace(self, num_gpus=num_gpus)


def load_node(path: str | Path, *, load_apps: bool = True) -> Node:
    """Reads and validates a node TOML file (and the app files it lists)."""
    path = Path(path)
    f = Fields(path, read_toml(path))
    f.reject_unknown({"name", "description", "gpus", "planner", "server", "control", "apps"})
    base = path.parent
    groups = load_gpu_groups(f, base)

    planner = load_section(PlannerSettings, f.sub("planner", {}))
    server = load_section(ServerSettings, f.sub("server", {}))
    control = load_section(ControlSettings, f.sub("control", {}), REMOVED_CONTROL)

    apps: list[App] = []
    if load_apps:
        for i, rel in enumerate(f.list("apps", [])):
            if not isinstance(rel, str):
                raise ConfigError(str(path), f"apps[{i}]", "expected a path to an app TOML file")
            app = load_app(base / rel)
            if any(a.name == app.name for a in apps):
                raise ConfigError(str(path), f"apps[{i}]", f"duplicate app name {app.name!r}")
            apps.append(app)
    for name, _ in planner.app_weights:
        if load_apps and not any(a.name == name for a in apps):
            raise ConfigError(str(path), f"planner.app_weights.{name}",
                              f"no app named {name!r} on this node")

    return Node(
        name=f.str("name", path.stem), gpu=composite_model(groups),
        num_gpus=sum(g.count for g in groups),
        mig_profiles=tuple(p for g in groups for p in g.mig_profiles),
        mps_levels=tuple(sorted({k for g in groups for k in g.mps_levels})),
        batch_sizes=tuple(sorted({b for g in groups for b in g.batch_sizes})),
        profiles_dir=groups[0].profiles_dir, backend=groups[0].backend,
        planner=planner, server=server, control=control, apps=tuple(apps), source=str(path),
        groups=groups if len(groups) > 1 else (),
    )


def load_node_profiles(node: Node, apps: tuple[App, ...] | list[App] | None = None) -> ProfileTable:
    """The node's profile table, checked to cover every variant of ``apps`` (default: the node's).

    A node of several groups: every group's rows, their profiles qualified by the group
    (``jigsaw.gpu_groups``); a variant needs rows in one group at least.
    """
    variants = [v.name for a in (apps if apps is not None else node.apps) for t in a.tasks
                for v in t.variants]
    if not node.is_mixed:
        table = with_share_rows(load_profiles(node.profiles_dir), node.gpu)
        check_coverage(table, variants, node.gpu.profile_names, node.source)
        return table
    rows = []
    for g in node.groups:
        own = with_share_rows(load_profiles(g.profiles_dir), g.model)
        check_coverage(own, [], g.model.profile_names, node.source)
        rows += [dataclasses.replace(r, mig_profile=qualified(g.name, r.mig_profile))
                 for r in own.rows() if r.batch in g.batch_sizes]
    table = ProfileTable(rows, " + ".join(str(g.profiles_dir) for g in node.groups))
    check_coverage(table, variants, node.gpu.profile_names, node.source)
    return table


if __name__ == "__main__":
    print(settings_reference(), end="")
