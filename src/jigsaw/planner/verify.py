"""An independent check of a plan: recomputes everything from the instance list and profiles.

Shares no code with the MILP: it is what the tests, ``jigsaw check plan.json`` and the
controller use to refuse a plan that breaks the paper's constraints.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from jigsaw.app import App
from jigsaw.mig import NUM_PLACEMENT_SLOTS, MigProfile
from jigsaw.node import Node
from jigsaw.plan import PlacedInstance, Plan
from jigsaw.planner.groups import gpu_of, group_layout_problems
from jigsaw.profiles import ProfileTable

_REL_TOL = 1e-6


def demand_and_supply(plan: Plan, app: App, factors: dict[tuple[str, str, str], float] | None
                      ) -> tuple[defaultdict[tuple[str, str], float], defaultdict[tuple[str, str], float]]:
    """Per (task, variant): the rate the plan's lanes send it (each lane's rate times the task's
    multiplicative factor on that lane) and the rate its instances carry."""
    demand: defaultdict[tuple[str, str], float] = defaultdict(float)
    for lane in plan.lanes:
        mult = app.multipliers(tuple(lane.variants[t] for t in app.task_names), factors)
        for t in app.task_names:
            demand[(t, lane.variants[t])] += lane.rate_rps * mult[t]
    supply: defaultdict[tuple[str, str], float] = defaultdict(float)
    for inst in plan.instances:
        supply[(inst.task, inst.variant)] += inst.count * inst.throughput_rps
    return demand, supply


def verify_plan(plan: Plan, app: App, node: Node, profiles: ProfileTable,
                factors: dict[tuple[str, str, str], float] | None = None) -> list[str]:
    """Every violated constraint of ``plan``, as readable sentences (empty: the plan is sound)."""
    if not plan.instances:
        return ["the plan has no instances"] if plan.feasible or plan.max_demand_plan else []
    mig = {p.name: p for p in node.gpu.profiles}
    problems = _verify_instances(plan, app, node, profiles, mig)
    problems.extend(_verify_latency(plan, app))
    rate = sum(lane.rate_rps for lane in plan.lanes)
    problems.extend(_verify_demand(plan, app, rate, factors))
    problems.extend(_verify_accuracy(plan, app, rate, factors))
    # Slices and the layout.
    # a share of a MIG instance (``jigsaw.shares``) costs a k-th of the instance's slices
    slices = sum(i.count * mig[i.mig_profile].compute_slices / (mig[i.mig_profile].share_of
                                                                 if mig[i.mig_profile].host else 1)
                 for i in plan.instances if i.mig_profile in mig)
    if abs(slices - plan.slices_used) > 1e-6:
        problems.append(f"slices_used {plan.slices_used} != recomputed {slices}")
    if slices > node.slices_available:
        problems.append(f"{slices} slices > {node.slices_available} available")
    problems.extend(_verify_layout(plan, node))
    return problems


def _verify_instances(plan: Plan, app: App, node: Node, profiles: ProfileTable,
                      mig: dict[str, MigProfile]) -> list[str]:
    """Each instance against its profile row, the GPU's MIG table, its memory and the search space."""
    problems: list[str] = []
    for inst in plan.instances:
        row = profiles.get(inst.variant, inst.mig_profile, inst.mps, inst.max_batch)
        label = f"{inst.task}/{inst.variant} on {inst.mig_profile}x{inst.mps} b{inst.max_batch}"
        if row is None:
            problems.append(f"{label}: no profile row")
            continue
        planned_rps = row.throughput_rps * node.planner.max_utilization
        if abs(row.latency_ms - inst.latency_ms) > 1e-6 * max(1.0, row.latency_ms) or \
                abs(planned_rps - inst.throughput_rps) > 1e-6 * max(1.0, planned_rps):
            problems.append(f"{label}: latency/throughput differ from the profile")
        if inst.mig_profile not in mig:
            problems.append(f"{label}: MIG profile not in the {node.gpu.name} table")
            continue
        if inst.mps * row.memory_mb > mig[inst.mig_profile].memory_gb * 1024:
            problems.append(f"{label}: {inst.mps} x {row.memory_mb:.0f} MB exceeds the instance memory")
        prof = mig[inst.mig_profile]
        cost = prof.compute_slices / prof.share_of if prof.host else prof.compute_slices
        if abs(inst.slices - cost) > 1e-9:
            problems.append(f"{label}: slices {inst.slices} != {cost:g}")
        if inst.count < 1:
            problems.append(f"{label}: count {inst.count} < 1")
        if plan.space in ("unopt", "a", "t", "at") and (inst.mig_profile != node.gpu.whole_gpu_profile.name
                                                        or inst.mps != 1):
            problems.append(f"{label}: space {plan.space} allows whole GPUs only")
        if plan.space in ("unopt", "s", "t", "st") and inst.variant != app.task(inst.task).best.name:
            problems.append(f"{label}: space {plan.space} allows the most accurate variant only")
    return problems


def _verify_latency(plan: Plan, app: App) -> list[str]:
    """Latency: the worst instance of each task, doubled for batching, along every path."""
    problems: list[str] = []
    worst: defaultdict[str, float] = defaultdict(float)
    for inst in plan.instances:
        worst[inst.task] = max(worst[inst.task], inst.latency_ms)
    for path in app.paths:
        total = sum(2 * worst[t] for t in path)
        if total > app.latency_slo_ms * (1 + _REL_TOL):
            problems.append(f"path {' -> '.join(path)}: 2 x latencies = {total:.1f} ms > SLO "
                            f"{app.latency_slo_ms:g} ms")
    return problems


def _verify_demand(plan: Plan, app: App, rate: float,
                   factors: dict[tuple[str, str, str], float] | None) -> list[str]:
    """Demand from the lanes (``rate`` in all) against the capacity of the instances, per
    (task, variant)."""
    problems: list[str] = []
    if abs(rate - plan.planned_rps) > _REL_TOL * max(1.0, plan.planned_rps):
        problems.append(f"lanes carry {rate:.6g} rps, the plan serves {plan.planned_rps:.6g}")
    demand, supply = demand_and_supply(plan, app, factors)
    # Every lane that carries requests runs the variant of each task they reach: the runtime
    # cannot route a request to a variant without a process, however small the lane's rate.
    run = {key for key, cap in supply.items() if cap > 0}
    for li, lane in enumerate(plan.lanes):
        if lane.rate_rps <= 0:
            continue
        mult = app.multipliers(tuple(lane.variants[t] for t in app.task_names), factors)
        for t in app.task_names:
            if mult[t] > 0 and (t, lane.variants[t]) not in run:
                problems.append(f"lane {li} sends {t} to variant {lane.variants[t]!r}, which the plan "
                                "does not run")
    for key, need in demand.items():
        if need > supply[key] * (1 + _REL_TOL) + 1e-9:
            problems.append(f"{key[0]}/{key[1]}: demand {need:.6g} rps > capacity {supply[key]:.6g} rps")
    return problems


def _verify_accuracy(plan: Plan, app: App, rate: float,
                     factors: dict[tuple[str, str, str], float] | None) -> list[str]:
    """Accuracy (PAS) of the lanes, relative to the most accurate variants: above the SLO and as
    reported."""
    if rate <= 0:
        return []
    problems: list[str] = []
    acc = sum(lane.rate_rps * app.lane_accuracy(tuple(lane.variants[t] for t in app.task_names), factors)
              for lane in plan.lanes)
    relative = acc / rate / app.max_accuracy(factors)
    if relative < plan.accuracy_slo * (1 - _REL_TOL):
        problems.append(f"accuracy {relative:.4f} < SLO {plan.accuracy_slo:g}")
    if abs(relative - plan.accuracy) > 1e-4:
        problems.append(f"reported accuracy {plan.accuracy:.6f} != recomputed {relative:.6f}")
    return problems


def _verify_layout(plan: Plan, node: Node) -> list[str]:
    if plan.layout is None:
        return ["the plan has no layout"]
    problems: list[str] = []
    mig = {p.name: p for p in node.gpu.profiles}
    if len(plan.layout.gpus) > node.num_gpus:
        problems.append(f"layout uses {len(plan.layout.gpus)} GPUs > {node.num_gpus}")
    placed: Counter[tuple[str, str, str, int, int]] = Counter()
    for g in plan.layout.gpus:
        occupied = [False] * NUM_PLACEMENT_SLOTS
        per_profile: Counter[str] = Counter()
        compute = 0
        shared = _verify_shares(g.gpu, g.instances, mig, problems)
        for p in g.instances:
            prof = mig.get(p.profile)
            if prof is None:
                problems.append(f"GPU {g.gpu}: unknown MIG profile {p.profile}")
                continue
            placed[(p.task, p.variant, p.profile, p.mps, p.max_batch)] += 1
            if prof.host:  # a share: its instance is checked once, as its host
                if (p.profile, p.start) not in shared:
                    continue
                shared.discard((p.profile, p.start))
                prof = mig[prof.host]
            per_profile[prof.name] += 1
            compute += prof.compute_slices
            if p.start not in prof.starts:
                problems.append(f"GPU {g.gpu}: {p.profile} cannot start at {p.start}")
            for s in range(p.start, min(p.start + prof.size, NUM_PLACEMENT_SLOTS)):
                if occupied[s]:
                    problems.append(f"GPU {g.gpu}: slot {s} used twice")
                occupied[s] = True
        for name, n in per_profile.items():
            if n > mig[name].max_per_gpu:
                problems.append(f"GPU {g.gpu}: {n} x {name} > {mig[name].max_per_gpu} allowed")
        most = gpu_of(node, g.gpu).compute_slices if 0 <= g.gpu < node.num_gpus else node.gpu.compute_slices
        if compute > most:
            problems.append(f"GPU {g.gpu}: {compute} compute slices > {most}")
    problems += group_layout_problems(plan.layout, node)
    wanted = Counter({(i.task, i.variant, i.mig_profile, i.mps, i.max_batch): i.count
                      for i in plan.instances})
    if placed != wanted:
        problems.append("the layout's instances differ from the plan's")
    return problems


def _verify_shares(gpu: int, placed: Sequence[PlacedInstance], mig: dict[str, MigProfile],
                   problems: list[str]) -> set[tuple[str, int]]:
    """The MIG instances one GPU's shares sit in, as (share profile, start): at most k shares in
    each, on distinct seats 0..k-1, and no two share profiles at one start (their instances
    would overlap: the slot check sees both)."""
    seats: defaultdict[tuple[str, int], list[int]] = defaultdict(list)
    for p in placed:
        prof = mig.get(p.profile)
        if prof is not None and prof.host:
            seats[(p.profile, p.start)].append(p.seat)
    for (name, start), taken in seats.items():
        k = mig[name].share_of
        if len(taken) > k:
            problems.append(f"GPU {gpu}: {len(taken)} shares of {name} at {start} > {k}")
        if len(set(taken)) != len(taken) or not all(0 <= s < k for s in taken):
            problems.append(f"GPU {gpu}: the seats {sorted(taken)} of {name} at {start} are not distinct "
                            f"in 0..{k - 1}")
    return set(seats)
