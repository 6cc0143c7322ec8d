"""The node model: GPUs and how they may be partitioned, planner settings, server limits, apps.

Loaded from a node TOML file (``examples/h100x4.toml``). Relative paths in it are relative to
the file. Every setting has the paper's value as its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jigsaw.app import App, load_app
from jigsaw.backends.registry import NAMES
from jigsaw.errors import ConfigError
from jigsaw.fields import Fields, read_toml
from jigsaw.mig import GPU_MODELS, GpuModel, MigProfile, gpu_model, whole_gpu_model
from jigsaw.profiles import ProfileTable, check_coverage, load_profiles

BACKENDS = NAMES  # the backend registry's names
PAPER_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
PAPER_BETA_SLICES = 28  # the paper's beta = 0.035 was chosen for a 28-slice node
PAPER_BETA = 0.035
NODE_OBJECTIVES = ("accuracy", "slices")


@dataclass(frozen=True)
class SegmentType:
    """A GPU segment: a MIG instance running ``mps`` identical MPS processes."""

    mig: MigProfile
    mps: int

    @property
    def slices(self) -> int:
        return self.mig.compute_slices

    @property
    def name(self) -> str:
        return f"{self.mig.name}x{self.mps}"


@dataclass(frozen=True)
class PlannerSettings:
    accuracy_slo: float = 0.9  # fraction of the best end-to-end accuracy
    demand_slack: float = 0.05  # added to the predicted demand before planning
    alpha: float = 1.0
    beta: float | None = None  # None: 0.035 * 28 / slices of the node (the paper's scale)
    hop_latency_ms: float = 10.0  # per communication hop; added to the SLO per path depth
    time_limit_s: float = 10.0
    # Stopping gap on the objective (accuracy units). None: half of beta, i.e. a plan is proven
    # when no plan is better by half a slice's cost (the "proven": below one slice).
    absolute_gap: float | None = None
    solver: str = "cbc"  # or "highs"
    space: str = "ast"
    max_utilization: float = 1.0  # plan instances to run at most this fraction of profiled throughput
    # The node-wide plan of all apps (planner.node_plan): "accuracy" maximises the weighted sum
    # of the apps' accuracies minus beta per slice; "slices" serves every app at its demand on
    # the fewest slices (accuracy only breaks ties).
    objective: str = "accuracy"
    app_weights: tuple[tuple[str, float], ...] = ()  # (app, weight) for "accuracy"; default 1 each
    formulation: str = "tight"  # or "reference": the original single MILP (kept to check against)
    # the instance that covers a task's remainder when a running plan is extended (anytime.extend_plan:
    # a spike's quick plan, the in-place extension) costs at least this many compute slices per MIG
    # memory slot it holds (7/8: a GPU's 7 slices over its 8 slots), so a 1g.20gb instance costs
    # 1.75 and a 1g.10gb one 1; never a slice more than by compute (anytime.slot_aware_cost). Why:
    # priced by compute alone, a spike's extensions filled every memory slot of the node with 7
    # slices free, and the next extension for the peak served nothing more. 0: compute slices alone
    extension_slices_per_slot: float = 0.875

    def app_weight(self, app: str) -> float:
        return dict(self.app_weights).get(app, 1.0)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_payload_bytes: int = 16 * 1024 * 1024
    max_queue: int = 4096  # requests admitted but not answered, per app
    ring_slots: int = 1024
    ring_slot_bytes: int = 64 * 1024
    worker_hang_timeout_s: float = 3.0  # a worker whose loop has not turned this long is hung
    worker_max_restarts: int = 3  # restarts of one worker within worker_restart_window_s before giving up
    worker_restart_window_s: float = 60.0
    # the paper's stale drop (§3.3): an item a full batch passed over and that then waited longer
    # than the app's staleness_ms. Off by default: each process has its own ring, so an item one
    # busy process passes over may be one another instance of its task could still have served
    # in time, and the paper's 20 ms drops it (bench/README.md, replay).
    stale_drops: bool = False
    # lane shift (runtime/lanes.py): a request whose drawn lane is backed up past its share of the
    # SLO takes the lane of the running plan that finishes it soonest (off: the plan's draw only)
    lane_shift: bool = True
    # admission counts the capacity of the plan's bottleneck task (each task's instances over the
    # items a request brings it, through the lanes' fan-out), not only of its roots: a chain whose
    # later task lost instances (an interim plan while they drain) admits only what it finishes.
    # Off: the roots' capacity, as the planner's plans are sized at every task
    admission_bottleneck: bool = False
    # the plan's admission limit counts the requests of the generation new requests go to, not
    # the backlog a previous generation still holds (it ends by its deadline there; max_queue still
    # bounds all of them): after a spike's switch that backlog shed every new request at the door
    # while the new instances sat idle (runtime/admission.py). Off: every request of the app counts
    admission_per_generation: bool = True
    # a request over the in-flight limit is shed only when the work queued ahead of it on the
    # lane it would take (the processes' queues and input rings, at their batch rates) plus the
    # lane's fastest path exceeds 0.75 of its deadline (runtime/admission.py, ``queue_admits``): the
    # count is an estimate of the queue, and it sheds requests that would have met their deadline
    # (a backlog counted that is not ahead of them, requests past the root). The same rule picks
    # which requests of a drain cut short are sent again (runtime/dispatch.py ``cut_generation``;
    # the rest are answered 504 at once). Off: the count decides, and every one is sent again
    admission_backlog: bool = True
    # idle worker processes (imports done) a re-plan hands new processes' specs to, so a switch
    # that starts processes does not wait for Python to start (runtime/spares.py); 0: off.
    # Kept only when the node re-plans (a controller runs)
    spare_workers: int = 4
    # worker processes forked from a fork server that did the worker's imports once at start-up
    # (runtime/forkserver.py) instead of a Python start each; false: python -m per process
    fork_server: bool = True
    # the HTTP front end: "fast" serves the hot OIP routes on httptools (runtime/fasthttp.py) and
    # hands every other request to aiohttp; "aiohttp" serves everything on aiohttp
    http: str = "fast"
    # a request head must arrive within this of its first byte (408), a connection's first byte
    # within this of its start (closed)
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0  # a request body must arrive within this of its head (408)
    keepalive_timeout_s: float = 30.0  # an idle keep-alive connection closes after this
    max_request_line_bytes: int = 8190  # method, URL and version (414)
    max_header_bytes: int = 16384  # a request's header lines together; aiohttp: each line (431)
    max_headers: int = 100  # header lines of one request (431)
    # open client connections; at the bound the least recently active one that owes no answer
    # is closed to take the new one, or the new one is refused when every one owes answers
    max_connections: int = 4096


HTTP_FRONTS = ("fast", "aiohttp")
PREDICTORS = ("recurring", "mean")  # control.predictor: spike-aware (default) or the paper's mean


@dataclass(frozen=True)
class ControlSettings:
    bin_seconds: float = 300.0
    history_bins: int = 5  # the predictor's window
    replan_violation_rate: float = 0.05  # re-plan early when the bin's SLO violations exceed it
    # re-plan early, for the observed rate, when the recent arrival rate exceeds what the plan holds
    replan_on_rate: bool = True
    repartition_delay_s: float = 2.0  # emulated: time a GPU is unavailable while repartitioned
    # every controller plan (and the first without --demand) holds this many concurrent requests
    # within the SLO: its demand is at least burst_requests / half the SLO (control/predictor.py
    # burst_floor_rps); 0: off
    burst_requests: int = 40
    # "recurring": the mean + slack, raised at bins where the history's demand jumps recur and in
    # the bin after a jump (control/predictor.py RecurringSpikePredictor); "mean": the paper's
    predictor: str = "recurring"
    # the recurring predictor's mean leaves out the bins of spikes that have ended (default: the
    # bins after a spike were planned for about twice their demand, the peak window's largest
    # over-provisioning, bench/README.md); false: it averages them in
    skip_ended_spikes: bool = True
    # the recurring predictor predicts a spike past its second bin (every bin since its jump at
    # spike level) at least at its last bin: the trace's spikes last three bins, and the mean
    # planned their third for two thirds of it; false: the mean (and the spike rules) only
    hold_spikes: bool = True
    # each plan holds the most the predictor expects over this many bins after the next one (a
    # spike predicted two bins ahead is planned for a bin early; on day 0 of the Twitter trace 1
    # raises the mean prediction by 15%); 0: the next bin only
    lookahead_bins: int = 0
    # the rate trigger fires only on a count the plan's rate would reach by chance less often than
    # the normal tail beyond this many standard deviations (an exact Poisson tail,
    # control/controller.py significant; 3.5: about 2 in 10000 windows); 0 (default): the rate
    # alone decides. At 3.5 the trough's misfires (a half-second window of about 11 arrivals read
    # 1.8x the plan about one bin in ten) were gone, but so was the headroom they left: the full
    # day's spikes met 10-11-slice plans whose spike plans needed every lane's slots and were
    # refused (bench/README.md, "The trough's self-inflicted violations")
    rate_trigger_z: float = 0.0
    # where the trigger's window (a tenth of the bin) holds fewer arrivals than the trigger needs
    # (control/controller.py MIN_ARRIVALS_FOR_RATE), it grows back within the bin until it holds
    # them, and a grown window fires only on a count significant at this many standard deviations
    # (the Poisson test above); 0: the window does not grow. Why: at ar_assistant's wall-clock rates
    # (time scale 20: 9-35 req/s) the half-second window held 20 arrivals only above 800 req/s,
    # beyond the app's capacity (691), and the trigger was blind to a 2.5x jump (day 0, bin 72:
    # 460 req/s on a plan for 182) until the loop's polls bunched a window
    rate_window_grow_z: float = 3.0
    # an urgent re-plan deploys one plan: a quick plan that serves is not followed by the exact one
    # (the next bin's re-plan brings it); false (default): quick plan, then exact plan
    single_reconfiguration: bool = False
    # a running plan that holds its demand is kept unless the new one frees at least this many
    # slices (a new generation's drain holds its slots for up to an SLO, and its processes start
    # on the node's CPUs); 1 (default): a plan of as many slices or more, better only in accuracy
    # or layout, is not worth a new generation (in the trough the routine re-plans replaced one
    # 7-slice plan by another in most bins, every process new); 0: any better plan replaces it
    shrink_min_slices: int = 1
    # a re-plan's new MIG instances keep off the slots of draining generations where the rest of
    # the node holds them (runtime/generations.py place_around); false (default): placed as if
    # none drained
    place_around_draining: bool = False
    # a re-plan whose new MIG instances need slots a draining generation still holds cuts that
    # drain short (its requests settled at once: runtime/generations.py _cut_drains) and takes the
    # slots; false (default: in three alternating pairs of peak-window replays on the 2-core machine
    # the three drain switches on measured more violations than off, bench/README.md): the re-plan
    # is refused, and the node serves on until the next one
    cut_drains: bool = False
    # ... only a drain with at most this many requests not answered yet (each is sent again on the
    # serving generation, its progress lost, and the draining processes' capacity goes with them:
    # cutting a drain of hundreds put a burst on the new plan); a busier drain refuses the re-plan
    cut_drain_max_unanswered: int = 8
    # the new instances keep off the slots of drains too busy to cut where the node holds them
    # elsewhere (runtime/generations.py place_around), so the re-plan is not refused for them (with
    # cut_drains only; off by default with it)
    place_around_busy_drains: bool = False
    # a replaced generation drains until every request it holds is settled, late credits (a
    # timed-out request's, for 10 s) included, up to the SLO and DRAIN_MARGIN_S, its slots held
    # (default, with the other two drain switches); false: it retires once every request is
    # answered, the answered ones still waiting for late credits forgotten
    drain_late_credits: bool = True
    # a re-plan whose new MIG instances need slots the app's own running instances hold drains those
    # first (runtime/generations.py _drain_first) only when the running plan does not hold the
    # demand: a drain-first serves on part of the plan for up to an SLO and holds the node's
    # re-plans meanwhile, a price for a plan the node needs, not for a better one; true: also then
    drain_first_when_holding: bool = False
    # a drain-first waits for the requests the app's running generation has not answered yet for
    # at most this share of the app's SLO (x the time scale), then sends the rest again on the
    # generation serving meanwhile and frees the slots (runtime/generations.py _drain_first); the
    # late credits of timed-out requests are not waited for. 1.0: up to the whole SLO
    drain_first_wait_slo: float = 0.25
    # a re-plan the app needs (its running plan does not hold the demand) whose new MIG instances
    # need slots draining generations hold waits for them as long (drain_first_wait_slo), then cuts
    # their drains short whatever they hold (runtime/generations.py _cut_drains); false (default:
    # in alternating pairs of peak-window replays on the 2-core machine it measured more
    # violations on both social_media and traffic_analysis, bench/README.md; at social_media's
    # time scale 60 the wait is about 10 s, two bins, and the re-sent requests came back 504): as
    # cut_drains says (refused by default)
    cut_drains_when_needed: bool = False
    # a re-plan the app needs (its running plan does not hold the demand) whose new MIG instances
    # need slots draining generations hold waits for those drains to end, at most until their own
    # deadline (the SLO x the time scale after their switch, when every request they hold is
    # answered or timed out), then takes the slots; nothing is sent again (runtime/generations.py
    # _cut_drains). Why: refused, the spike's plan was retried only at the next trigger, after the
    # drain had ended anyway (113 refusals over day 0 of traffic_analysis); on by default after
    # alternating peak-window pairs (bench/README.md, "The time scale, and needed re-plans that
    # wait"). cut_drains_when_needed takes precedence
    wait_drains_when_needed: bool = True
    # ... unless the new instances also need the slots of so many of the app's running instances
    # that the drain-first after the wait would leave it no lane: then it is refused before the
    # wait, not after (runtime/generations.py _no_lane_before_wait), and the re-plan's quick plan
    # goes out at once (quick_after_refusal). Why: on day 0 of traffic_analysis 8 needed re-plans,
    # at three spikes among them, waited 5-12 s and were then refused that way; false: after
    refuse_before_drain_wait: bool = True
    # a plan that frees at least this many slices of a running plan that holds the demand is worth
    # a drain-first (control/controller.py _deploy): without it a spike's plan stayed until a
    # smaller plan happened to fit beside it; 0 (default): never (drain_first_when_holding decides)
    shrink_drain_min_slices: int = 0
    # a needed re-plan of the rate trigger (its running plan did not hold the rate when it was
    # pushed) asks the controller again, after any wait for the drains in its way and before a
    # drain-first of the app's running instances, whether the rate now arriving still exceeds what
    # the running plan holds; when not (the spike has passed) it drains nothing and keeps the
    # running plan (runtime/generations.py DesiredState.still_needed, control/controller.py
    # AppController.still_needed; a bin's re-plan, which may be for a predicted spike, is asked only
    # once the bin it plans for has ended: NodeController._recheck).
    # Why: on day 0 of social_media the exact plan for bin 157's 4228 req/s waited 7.9 s for drains,
    # then drained 6 of the 16-slice plan's instances for 5.4 s, and switched 18.5 s after it was
    # decided, when 1385 req/s arrived, which the running plan held; the interim plan and the
    # re-sent backlog violated 42-78% of bins 158-160. false: the drain-first goes on regardless
    recheck_need_before_drain_first: bool = True
    # a needed plan that waits for the drains in its way (wait_drains_when_needed) is asked at each
    # poll of the wait whether the rate now arriving is more than this many times the demand it
    # was asked for (significantly: rate_trigger_z); then the wait ends, nothing changes, and the
    # rate trigger's next re-plan is for the rate that arrives (runtime/generations.py DesiredState.outgrown,
    # control/controller.py AppController.outgrows). Why: on day 0 of social_media a re-plan for
    # 2417 req/s waited 10.5 s for two ordinary drains and held the node's re-plan lock while the
    # arrivals rose to 4535 and 6314 req/s: the running plan for 2021 shed 547 requests (bin 73,
    # 47%), and the in-place extension that served the spike came only after the wait. A plan
    # capped below the demand it was asked for (the most that fits) is never asked: a re-plan for
    # more gives the same cap. 0: off
    end_wait_outgrown_above: float = 1.25
    # a drain-first that would leave the app no lane (every instance of a task in the new ones'
    # way) drains in two steps instead of being refused: all but at most 4 of those instances
    # first, then the rest while the new instances that fit by then serve beside the running
    # plan's others (runtime/generations.py two_step_split, interim_plan). Why: at the peak no MIG
    # memory slot is free, a plan for more moves most running instances, and every such plan was
    # refused: the running plan served a rate it could not hold. Off by default: no full day
    # needed it, and both times it ran on a replay (ar_assistant's steady peak window) the second
    # step's interim generation was not ready after 120 s and the running plan was restored, the
    # re-plan lock held meanwhile (bench/README.md)
    two_step_drain_first: bool = False
    # a needed plan whose MIG instances need the slots of the app's running instances drains them
    # first only when it plans at least what the running plan serves at full utilization (its planned
    # rate over planner.max_utilization) or when the running plan's queue is past what the door
    # admits (0.75 of a deadline: it does not cope); else it keeps the running plan at once,
    # without waiting for the drains in its way (runtime/generations.py _serves_on).
    # Why: a spike's request may queue for its deadline, so the running plan run hot serves what
    # such a plan would, while the drain-first serves on part of the plan and answers 504 what the
    # drained instances' queue cannot finish: on day 0 of social_media (time scale 30) two such
    # plans, 14% and 24% above the running plan at max_utilization 0.8, failed 53 and 101 requests
    # and served 7.3 and 13.3 s after they were decided. At max_utilization 1 only a plan that
    # plans less is kept out. false: the drain-first goes on for any needed plan
    drain_first_past_headroom: bool = True
    # the headroom rule above keeps a running generation from a drain-first for plans up to 5%
    # past the least plan it kept out over it; a plan further past is a spike still rising, and
    # drains first now (runtime/generations.py _serves_on). Why: on day 0 of traffic_analysis the
    # rule kept out plans for 1245, 1219 and 1386 req/s over one for 1080 while the arrivals
    # climbed to 1610; the quick plan for 1597 that followed drained 9 running instances for 19
    # new ones, its interim plan shed 227 requests at the door and it served 7 s after it was
    # decided (bins 115-116: 22% and 91% violations). false: the rule keeps out any plan below
    # the running plan's full utilization
    headroom_yields_when_rising: bool = True
    # the headroom rule above weighs a needed plan capped below the rate it was asked for (at the
    # node's capacity, or a quick plan's fraction) by that rate: it keeps the running plan only
    # when the running plan serves the demand at full utilization, not merely the cap
    # (runtime/generations.py _serves_on). Why: on the --steady-state peak window of ar_assistant
    # plans asked for 671 and 798 req/s and capped at 625-627 were kept out over a running plan
    # serving 634 at full utilization while 691 req/s arrived: its queue grew to 17 s and bin 115
    # failed 21 of 198 (on social_media a plan asked for 7253 capped at 6802 over one serving 6810:
    # 73 of 1130). false: the cap is weighed
    headroom_weighs_demand: bool = True
    # the queue rule below keeps the running plan only while the arrivals the needed plan was asked
    # for (its demand less planner.demand_slack) are within what the running plan serves at full
    # utilization; past that its queue only grows (runtime/generations.py _serves_on). Why: on the
    # --steady-state peak window the rule kept a running plan serving 6819 req/s at full utilization
    # under 6887 arriving (social_media, bin 115): its queue grew from 8.4 to 14.7 s and 23 of 1130
    # were answered 504; on ar_assistant the same at 691 arriving over 667. Off by default: with it
    # on, the plans it let past were refused next (the app would have no lane left while the
    # instances in their way drained: 10 and 3 refusals on the two peak windows) and the windows
    # measured 1.38% and 0.21% against 0.15% and 0.13% with it off (bench/README.md)
    queue_yields_past_full: bool = False
    # the headroom rule above keeps the running plan only for a needed plan below this fraction of
    # what the running plan serves at full utilization (1: up to all of it). Why a knob: on the
    # emulated node a plan for 5455 req/s (social_media, max_utilization 0.8) played at 1.1x its rate
    # violated 0.07% and at 1.25x (its full utilization) 4.74% (bench/plan_holds.py --play-factor):
    # its busiest worker was 99% busy at the planned rate already, running smaller batches. At 0.88
    # (what held) a social_media day lost a bin to a drain-first it let through (23.6%) and the
    # steady windows measured 1.42% / 0.12% (bench/README.md), so the default keeps all of it
    headroom_full_fraction: float = 1.0
    # a needed plan whose MIG instances need the slots of the app's running instances keeps the
    # running plan while that plan's queue is longer than a drain-first waits for the instances it
    # drains (drain_first_wait_slo of the SLO) and within what its door admits (0.75 of a
    # deadline), whatever the new plan plans (runtime/generations.py _serves_on). Why: what the
    # drained instances hold past that wait is sent again behind the interim plan's queue or
    # answered 504, while the running plan answers it within its deadline: on the social_media peak
    # window (time scale 30) a plan for 5808 req/s over one for 4460 drained 7 running instances
    # with 10.5-11 s of queue on a 21.3 s deadline, failed 405 requests and switched 13.7 s after
    # it was decided. false: the queue's length does not keep a drain-first out
    drain_first_within_wait: bool = True
    # a running plan that holds its demand, whose re-planned smaller plan was not applied (its MIG
    # instances need slots the running ones hold: no drain-first for a plan that is only better),
    # gives back the instances the demand leaves spare (planner/anytime.py trim_plan: what stays
    # runs where it runs, every process kept, no slot waited for) when that frees at least this
    # many slices (control/controller.py _trim_running). Why: ar_assistant's spike plans fill the
    # node and were kept through the quiet bins after each spike (54% of the slices on day 0);
    # 0: off
    trim_min_slices: int = 4
    # a running plan that holds its demand is not replaced (control/controller.py settle) until it
    # has served this many bins: the rate trigger raised a plan within a bin and the next bin's
    # re-plan took it down at once, each down-switch a generation whose drain (up to an SLO x the
    # time scale) held slots the next raise waited for; 0 (default): replaced at once
    keep_new_plan_bins: int = 0
    # an app whose plans the runtime refused in a re-plan (a drain-first that would leave it no
    # lane: a spike's plans reuse the slots of a small running plan) and whose running plan does
    # not hold its demand gets that plan extended in place for the largest share of the demand
    # that packs beside every running instance (planner/node_plan.py extend_in_place;
    # control/controller.py _extend_after_refusal); false: the running plan serves on
    extend_in_place_after_refusal: bool = True
    # a plan an app needs (its running plan does not hold the demand) goes beside everything that
    # runs and drains when it fits so (runtime/generations.py Beside: its running instances kept
    # where they run, the others on slots nothing holds), so it neither waits for a drain nor needs
    # a drain-first; false: placed as any plan (over draining slots, or over the app's own)
    place_needed_beside: bool = True
    # ... and where it does not fit so and the running plan holds less than this share of the
    # demand (a spike), the running plan is extended in place for the largest share of the demand
    # that does fit (planner/node_plan.py extend_in_place with the runtime's check), at once,
    # instead of the plan, and the re-plan's later plan (the exact one) too where it needs the
    # extension's running slots (control/controller.py _needed_beside). Why: ar_assistant's spike plans
    # needed the 10-slice running plan's slots, were refused three times ("no lane left") over 9 s
    # while 18 slices were free, and bins 90-92 met the small plan. Not for a small shortfall: an
    # extension for a few percent more costs slices no later plan gives back (46% of the slices
    # against 38% on ar_assistant's bins 84-100 with it for every shortfall); 0: off, the plan is
    # pushed and extended in place only after a refusal (extend_in_place_after_refusal)
    extend_in_place_first_below: float = 0.8
    # ... and where no extension beside everything that runs and drains serves enough more (the
    # draining generations hold the MIG slots), the running plan is extended over the slots that
    # only drain: it waits for those drains to end (wait_drains_when_needed) and drains none of the
    # app's running instances (runtime/generations.py DesiredState.over_draining). Why: on
    # social_media's bin-156 spike the drains of the plans the spike had swamped held every free
    # MIG slot ("8 slices free" counted compute slices; no memory slot was free), so the exact
    # plan was pushed instead: it waited 13.3 s for those drains, then drained 5 of the running
    # instances for 5.4 s (309 requests sent again) and served 21.7 s after it was decided.
    # false: the exact plan is pushed
    extend_over_draining: bool = True
    # a plan's new MIG instances go, among the valid starts beside what runs, where they strand the
    # fewest other compute slices (gpu/layout.py _greedy_against: a GPU whose memory slots run out
    # leaves its free slices unusable), and only then first fit. Why: on traffic_analysis's spike
    # the running layouts kept 1-3 compute slices (1.5 on average) fewer usable than the best
    # packing of the same instances, and the peak's in-place extension found "5 slices free, 0 MIG
    # memory slots" (1.1 on average with it, bench/README.md).
    # false: first fit (the fullest GPU first), the start leaving the most room
    keep_compute_usable: bool = True
    # a re-plan the node needs (a running plan does not hold its demand) deploys first whichever
    # of its quick and exact plans starts fewer processes (the quick one keeps the running plans
    # and adds instances: a spike's exact plan restarted every process, 5-17 s to its switch), and
    # the other waits for the next bin's re-plan (control/controller.py); false (default: one
    # alternating pair per app of peak-window replays measured no gain, bench/README.md, and more
    # refused re-plans: the quick plan's added instances often need slots that still drain): the
    # exact plan when it is in within the patience
    fewest_starts_first: bool = False
    # a plan the runtime refused before changing anything (a drain-first that would leave the app
    # no lane, or slots draining generations hold: runtime/generations.py DrainRefused) is followed
    # by the same re-plan's quick plan when that one serves more than the running plan (it keeps
    # the running instances and adds some, so it needs no drain-first: control/controller.py);
    # false: the running plan serves on until the next re-plan. Why: a spike's exact plan
    # rearranges the node, and on day 0 of traffic_analysis its refusal left bin 187 (1414 req/s)
    # on the 1007 req/s plan while the quick plan for the spike had been found in 30 ms
    quick_after_refusal: bool = True
    # a solve that overruns its time limit is killed after twice the limit plus this many bins of
    # grace (at least 3 s, at most 30 s: control/solver.py grace_for_bins); its re-plan keeps the
    # running plans. Why: the controller holds its re-plan lock meanwhile; with 5 s bins the fixed
    # 30 s grace froze the node's re-plans for seven bins while the solver process took a core.
    # 0: the fixed 30 s
    solver_grace_bins: float = 1.0
    # a plan the app needed (its running plan did not hold the demand), once it serves, takes its
    # predecessor's unanswered requests at once (sent again on it; the predecessor retires without
    # draining: runtime/generations.py _hand_over) instead of leaving them queued on the smaller
    # plan that met the burst; false (default: worse in two alternating pairs of spike-window
    # replays, 5.5% vs 0% and 28% vs 7%: each needed switch re-sent a burst of restarted work,
    # bench/README.md): the predecessor drains them
    handover_on_needed_switch: bool = False
    # a re-plan of the controller's that finds no plan at all (neither quick nor exact: near and
    # above the node's capacity, or a planner error) is asked once more at this share of every
    # app's demand (control/controller.py replan): a plan for most of a spike beats the quiet plan
    # through it; 0: not asked again
    unplanned_retry_share: float = 0.85
    # a plan the controller's re-plan found that does not hold its app's demand either (the
    # demands did not fit: a spike at the node's capacity) and whose switch would wait for slots
    # that run or drain replaces the running plan only when it plans at least this share more than
    # the running plan (control/controller.py _short_of_gain). Why: at ar_assistant's spike (bin
    # 115 of day 0, 691 req/s against 691 of capacity) the re-plan for 754 req/s found a 28-slice
    # plan for 624 req/s against the running 24-slice plan's 613, and its switch, behind two drains
    # and a drain-first, took 39.6 s; the drain-first served on part of the plan and the next bin
    # met it (18.9% violations in steady state); 0: any such plan replaces the running one
    short_plan_min_gain: float = 0.1
    # early re-plans one app may trigger per bin: the violation trigger fires once, and the rate
    # trigger again (against the plan the earlier one deployed) while fewer than this many ran.
    # Why: a spike's first early re-plan can read a rate from the first second of the bin (bin 258
    # of day 0: a violation re-plan for 489 rps against 906 rps of demand) and, once per bin, the
    # bin met the spike on it; 1: once per bin
    early_replans_per_bin: int = 2


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

    @property
    def slices_available(self) -> int:
        return self.num_gpus * self.gpu.compute_slices

    @property
    def segment_types(self) -> tuple[SegmentType, ...]:
        return tuple(SegmentType(self.gpu.profile(p), k)
                     for p in self.mig_profiles for k in self.mps_levels)

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
        """The same node with another GPU count (capacity studies on hypothetical nodes)."""
        from dataclasses import replace
        return replace(self, num_gpus=num_gpus)


def load_node(path: str | Path, *, load_apps: bool = True) -> Node:
    """Reads and validates a node TOML file (and the app files it lists)."""
    path = Path(path)
    f = Fields(path, read_toml(path))
    f.reject_unknown({"name", "description", "gpus", "planner", "server", "control", "apps"})
    base = path.parent

    g = f.sub("gpus")
    g.reject_unknown({"model", "count", "mig_profiles", "mps_levels", "batch_sizes",
                      "profiles_dir", "backend", "mig", "memory_gb", "sm_count"})
    model_name = g.str("model")
    if not g.bool("mig", True):
        gpu = _whole_gpu(g, model_name)
    else:
        for key in ("memory_gb", "sm_count"):
            if g.has(key):
                raise g.error(key, "only a GPU used whole (mig = false) takes it; a MIG GPU's "
                                   "figures come from its MIG table")
        try:
            gpu = gpu_model(model_name)
        except KeyError:
            raise g.error("model", f"unknown GPU model {model_name!r} (known: {', '.join(GPU_MODELS)}; "
                                   "any other GPU is used whole: mig = false, memory_gb, "
                                   "sm_count)") from None
    count = g.integer("count", low=1, high=100_000)
    mig_profiles = g.list("mig_profiles", list(gpu.profile_names))
    for i, p in enumerate(mig_profiles):
        if p not in gpu.profile_names:
            raise ConfigError(str(path), f"gpus.mig_profiles[{i}]",
                              f"MIG profile {p!r} is not in the {gpu.name} table "
                              f"({', '.join(gpu.profile_names)})")
    mps_levels = g.list("mps_levels", [1, 2, 3, 4])
    if not mps_levels or not all(isinstance(k, int) and 1 <= k <= 48 for k in mps_levels):
        raise g.error("mps_levels", f"expected MPS levels between 1 and 48, got {mps_levels!r}")
    batch_sizes = g.list("batch_sizes", list(PAPER_BATCH_SIZES))
    if not batch_sizes or not all(isinstance(b, int) and 1 <= b <= 4096 for b in batch_sizes):
        raise g.error("batch_sizes", f"expected batch sizes between 1 and 4096, got {batch_sizes!r}")
    default_profiles = f"../profiles/{gpu.name.lower()}" + ("" if gpu.mig else "-whole")
    profiles_dir = (base / g.str("profiles_dir", default_profiles)).resolve()
    backend = g.str("backend", "tensorrt")
    if backend not in BACKENDS:
        raise g.error("backend", f"expected one of {', '.join(BACKENDS)}, got {backend!r}")

    p = f.sub("planner", {})
    p.reject_unknown(set(PlannerSettings.__dataclass_fields__))
    from jigsaw.spaces import SPACES
    solver = p.str("solver", "cbc")
    if solver not in ("cbc", "highs"):
        raise p.error("solver", f"expected 'cbc' or 'highs', got {solver!r}")
    space = p.str("space", "ast")
    if space not in SPACES:
        raise p.error("space", f"expected one of {', '.join(SPACES)}, got {space!r}")
    objective = p.str("objective", "accuracy")
    if objective not in NODE_OBJECTIVES:
        raise p.error("objective", f"expected one of {', '.join(NODE_OBJECTIVES)}, got {objective!r}")
    formulation = p.str("formulation", "tight")
    if formulation not in ("tight", "reference"):
        raise p.error("formulation", f"expected 'tight' or 'reference', got {formulation!r}")
    weights_raw = p.sub("app_weights", {})
    app_weights = tuple((name, weights_raw.number(name, low=0)) for name in sorted(weights_raw.table))
    planner = PlannerSettings(
        accuracy_slo=p.number("accuracy_slo", 0.9, low=0, high=1, low_open=True),
        demand_slack=p.number("demand_slack", 0.05, low=0, high=10),
        alpha=p.number("alpha", 1.0, low=0),
        beta=p.number("beta", None, low=0) if p.has("beta") else None,
        hop_latency_ms=p.number("hop_latency_ms", 10.0, low=0),
        time_limit_s=p.number("time_limit_s", 10.0, low=0, low_open=True),
        absolute_gap=p.number("absolute_gap", None, low=0) if p.has("absolute_gap") else None,
        solver=solver,
        space=space,
        max_utilization=p.number("max_utilization", 1.0, low=0, high=1, low_open=True),
        objective=objective,
        app_weights=app_weights,
        formulation=formulation,
        extension_slices_per_slot=p.number("extension_slices_per_slot", 0.875, low=0, high=7),
    )

    s = f.sub("server", {})
    s.reject_unknown(set(ServerSettings.__dataclass_fields__))
    server = ServerSettings(
        host=s.str("host", "127.0.0.1"),
        port=s.integer("port", 8000, low=0, high=65535),
        max_payload_bytes=s.integer("max_payload_bytes", 16 * 1024 * 1024, low=1024),
        max_queue=s.integer("max_queue", 4096, low=1),
        ring_slots=s.integer("ring_slots", 1024, low=2, high=1 << 20),
        ring_slot_bytes=s.integer("ring_slot_bytes", 64 * 1024, low=256, high=1 << 30),
        worker_hang_timeout_s=s.number("worker_hang_timeout_s", 3.0, low=0.5),
        worker_max_restarts=s.integer("worker_max_restarts", 3, low=0),
        stale_drops=s.bool("stale_drops", False),
        lane_shift=s.bool("lane_shift", True),
        admission_bottleneck=s.bool("admission_bottleneck", False),
        admission_per_generation=s.bool("admission_per_generation", True),
        admission_backlog=s.bool("admission_backlog", True),
        worker_restart_window_s=s.number("worker_restart_window_s", 60.0, low=0, low_open=True),
        spare_workers=s.integer("spare_workers", 4, low=0, high=64),
        fork_server=s.bool("fork_server", True),
        http=s.str("http", "fast"),
        header_timeout_s=s.number("header_timeout_s", 10.0, low=0, low_open=True),
        body_timeout_s=s.number("body_timeout_s", 30.0, low=0, low_open=True),
        keepalive_timeout_s=s.number("keepalive_timeout_s", 30.0, low=0, low_open=True),
        max_request_line_bytes=s.integer("max_request_line_bytes", 8190, low=64, high=1 << 20),
        max_header_bytes=s.integer("max_header_bytes", 16384, low=256, high=1 << 24),
        max_headers=s.integer("max_headers", 100, low=4, high=10000),
        max_connections=s.integer("max_connections", 4096, low=1, high=1 << 20),
    )
    if server.http not in HTTP_FRONTS:
        raise s.error("http", f"expected one of {', '.join(HTTP_FRONTS)}, got {server.http!r}")

    c = f.sub("control", {})
    c.reject_unknown(set(ControlSettings.__dataclass_fields__))
    predictor = c.str("predictor", "recurring")
    if predictor not in PREDICTORS:
        raise c.error("predictor", f"expected one of {', '.join(PREDICTORS)}, got {predictor!r}")
    outgrown_above = c.number("end_wait_outgrown_above", 1.25, low=0)
    if 0 < outgrown_above < 1:
        raise c.error("end_wait_outgrown_above", f"expected 0 (off) or a number >= 1, got {outgrown_above!r}")
    control = ControlSettings(
        bin_seconds=c.number("bin_seconds", 300.0, low=0, low_open=True),
        history_bins=c.integer("history_bins", 5, low=1),
        replan_violation_rate=c.number("replan_violation_rate", 0.05, low=0, high=1),
        replan_on_rate=c.bool("replan_on_rate", True),
        repartition_delay_s=c.number("repartition_delay_s", 2.0, low=0),
        burst_requests=c.integer("burst_requests", 40, low=0),
        predictor=predictor,
        rate_trigger_z=c.number("rate_trigger_z", 0.0, low=0),
        rate_window_grow_z=c.number("rate_window_grow_z", 3.0, low=0),
        single_reconfiguration=c.bool("single_reconfiguration", False),
        shrink_min_slices=c.integer("shrink_min_slices", 1, low=0),
        place_around_draining=c.bool("place_around_draining", False),
        cut_drains=c.bool("cut_drains", False),
        cut_drain_max_unanswered=c.integer("cut_drain_max_unanswered", 8, low=0),
        place_around_busy_drains=c.bool("place_around_busy_drains", False),
        drain_late_credits=c.bool("drain_late_credits", True),
        drain_first_when_holding=c.bool("drain_first_when_holding", False),
        drain_first_wait_slo=c.number("drain_first_wait_slo", 0.25, low=0, high=1),
        cut_drains_when_needed=c.bool("cut_drains_when_needed", False),
        wait_drains_when_needed=c.bool("wait_drains_when_needed", True),
        refuse_before_drain_wait=c.bool("refuse_before_drain_wait", True),
        shrink_drain_min_slices=c.integer("shrink_drain_min_slices", 0, low=0),
        recheck_need_before_drain_first=c.bool("recheck_need_before_drain_first", True),
        end_wait_outgrown_above=outgrown_above,
        two_step_drain_first=c.bool("two_step_drain_first", False),
        drain_first_past_headroom=c.bool("drain_first_past_headroom", True),
        drain_first_within_wait=c.bool("drain_first_within_wait", True),
        headroom_yields_when_rising=c.bool("headroom_yields_when_rising", True),
        headroom_weighs_demand=c.bool("headroom_weighs_demand", True),
        queue_yields_past_full=c.bool("queue_yields_past_full", False),
        headroom_full_fraction=c.number("headroom_full_fraction", 1.0, low=0.5, high=1),
        trim_min_slices=c.integer("trim_min_slices", 4, low=0),
        keep_new_plan_bins=c.integer("keep_new_plan_bins", 0, low=0),
        extend_in_place_after_refusal=c.bool("extend_in_place_after_refusal", True),
        place_needed_beside=c.bool("place_needed_beside", True),
        extend_in_place_first_below=c.number("extend_in_place_first_below", 0.8, low=0, high=1),
        extend_over_draining=c.bool("extend_over_draining", True),
        keep_compute_usable=c.bool("keep_compute_usable", True),
        fewest_starts_first=c.bool("fewest_starts_first", False),
        quick_after_refusal=c.bool("quick_after_refusal", True),
        solver_grace_bins=c.number("solver_grace_bins", 1.0, low=0),
        handover_on_needed_switch=c.bool("handover_on_needed_switch", False),
        unplanned_retry_share=c.number("unplanned_retry_share", 0.85, low=0, high=1),
        short_plan_min_gain=c.number("short_plan_min_gain", 0.1, low=0),
        early_replans_per_bin=c.integer("early_replans_per_bin", 2, low=1),
        skip_ended_spikes=c.bool("skip_ended_spikes", True),
        hold_spikes=c.bool("hold_spikes", True),
        lookahead_bins=c.integer("lookahead_bins", 0, low=0, high=12),
    )

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
        name=f.str("name", path.stem), gpu=gpu, num_gpus=count,
        mig_profiles=tuple(mig_profiles), mps_levels=tuple(sorted(set(mps_levels))),
        batch_sizes=tuple(sorted(set(batch_sizes))), profiles_dir=profiles_dir, backend=backend,
        planner=planner, server=server, control=control, apps=tuple(apps), source=str(path),
    )


def _whole_gpu(g: Fields, model_name: str) -> GpuModel:
    """A GPU without MIG (``mig = false``): a known MIG GPU with MIG off, or any GPU whose
    ``memory_gb`` and ``sm_count`` the file gives."""
    try:
        known: GpuModel | None = gpu_model(model_name)
    except KeyError:
        known = None
    if known is not None and known.kind == "cpu":
        raise g.error("mig", f"{model_name} is a CPU device; mig applies to GPUs")
    for key in ("memory_gb", "sm_count"):
        if known is None and not g.has(key):
            raise g.error(key, f"missing: {model_name!r} is not a GPU jigsaw knows, so a whole-GPU "
                               "node gives its memory_gb and sm_count")
    memory_gb = g.number("memory_gb", low=0, low_open=True) if g.has("memory_gb") \
        else known.memory_gb  # type: ignore[union-attr]
    sm_count = g.integer("sm_count", low=1) if g.has("sm_count") else known.sm_count  # type: ignore[union-attr]
    return whole_gpu_model(known.name if known else model_name, memory_gb, sm_count)


def load_node_profiles(node: Node, apps: tuple[App, ...] | list[App] | None = None) -> ProfileTable:
    """The node's profile table, checked to cover every variant of ``apps`` (default: the node's)."""
    table = load_profiles(node.profiles_dir)
    variants = [v.name for a in (apps if apps is not None else node.apps) for t in a.tasks
                for v in t.variants]
    check_coverage(table, variants, node.gpu.profile_names, node.source)
    return table
