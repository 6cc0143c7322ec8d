"""The tight formulation against the reference, the node-wide plan and the anytime incumbent."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from factories import make_app, make_node, make_profiles

from jigsaw.errors import ConfigError, PlanError
from jigsaw.node import load_node, load_node_profiles
from jigsaw.planner.anytime import quick_plan
from jigsaw.planner.milp import capacity, plan, plan_anytime
from jigsaw.planner.node_plan import plan_node
from jigsaw.planner.packer import validate_layout
from jigsaw.planner.verify import verify_plan

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "examples" / "h100x4.toml"

# A chain where latency binds: a fast and a slow variant per task, an SLO that cannot take the
# largest batches of both.
CHAIN = dict(
    tasks={"a": [("a1", 70.0), ("a2", 80.0)], "b": [("b1", 60.0), ("b2", 66.0)], "c": [("c1", 50.0)]},
    edges=[("a", "b", {"a1": 1.0, "a2": 1.5}), ("b", "c", {"b1": 0.5, "b2": 0.8})],
)
CHAIN_BASE = {"a1": 2.0, "a2": 5.0, "b1": 3.0, "b2": 7.0, "c1": 1.0}
TINY = dict(tasks={"a": [("a1", 70.0), ("a2", 80.0)], "b": [("b1", 60.0)]},
            edges=[("a", "b", {"a1": 1.0, "a2": 1.6})])


@pytest.fixture(scope="module")
def example():
    node = load_node(NODE)
    return node, load_node_profiles(node)


def _chain():
    app = make_app(**CHAIN, latency_slo_ms=160.0)
    node = make_node(num_gpus=2, mps_levels=(1, 2), batch_sizes=(1, 4, 16))
    return app, node, make_profiles(node, CHAIN_BASE)


@pytest.mark.parametrize("demand", [20.0, 150.0, 400.0, 900.0])
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_tight_optimum_equals_the_reference_optimum(demand: float, solver: str) -> None:
    app, node, profiles = _chain()
    tight = plan(app, node, profiles, demand, solver=solver, formulation="tight", time_limit_s=60)
    ref = plan(app, node, profiles, demand, solver=solver, formulation="reference", time_limit_s=60)
    assert verify_plan(tight, app, node, profiles) == []
    assert tight.feasible == ref.feasible
    if tight.status == ref.status == "optimal" and tight.feasible:
        assert tight.objective == pytest.approx(ref.objective, abs=1e-6)
        assert tight.gap == 0


@pytest.mark.parametrize(("app_name", "fraction"), [("social_media", 0.3), ("social_media", 0.8),
                                                    ("ar_assistant", 0.1), ("ar_assistant", 0.5),
                                                    ("traffic_analysis", 0.2)])
def test_tight_equals_reference_on_bench_instances(example, app_name: str, fraction: float) -> None:
    """A sample of the bench's instances (HiGHS, short limits): same optimum where both prove it."""
    node, profiles = example
    # without MIG-instance shares: the two formulations' optima may differ among equals, and the share
    # pass over each (``share_merge``) may then free different slices
    node = dataclasses.replace(node, gpu=dataclasses.replace(node.gpu, profiles=node.gpu.devices))
    app = node.app(app_name)
    cap = {"social_media": 8502.28, "traffic_analysis": 2012.87, "ar_assistant": 863.68}[app_name]
    tight = plan(app, node, profiles, fraction * cap, solver="highs", formulation="tight", time_limit_s=20)
    assert verify_plan(tight, app, node, profiles) == []
    ref = plan(app, node, profiles, fraction * cap, solver="highs", formulation="reference", time_limit_s=20)
    if tight.status == ref.status == "optimal":
        # each proven plan is at most the stopping gap below the optimum
        assert tight.objective == pytest.approx(ref.objective, abs=node.absolute_gap + 1e-6)
    else:
        pytest.skip(f"not both proven within the limit ({tight.status}, {ref.status})")


def test_unknown_formulation_is_a_plan_error() -> None:
    app = make_app(**TINY)
    node = make_node()
    with pytest.raises(PlanError):
        plan(app, node, make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0}), 5.0, formulation="nope")


def test_capacity_is_the_same_on_every_run() -> None:
    app, node, profiles = _chain()
    first = capacity(app, node, profiles)
    again = capacity(app, node, profiles)
    assert first.status == "optimal"
    assert first.max_demand_rps == again.max_demand_rps
    assert first.plan.slices_used == again.plan.slices_used
    assert verify_plan(first.plan, app, node, profiles) == []


def test_node_plan_shares_the_slices_and_one_layout(example) -> None:
    node, profiles = example
    demands = {"social_media": 2000.0, "traffic_analysis": 150.0, "ar_assistant": 100.0}
    result = plan_node(node.apps, node, profiles, demands, solver="highs", time_limit_s=30)
    assert result.feasible and result.status in ("optimal", "feasible")
    assert set(result.plans) == set(demands)
    assert result.slices_used == sum(p.slices_used for p in result.plans.values()) <= node.slices_available
    assert validate_layout(result.layout, node.gpu) == []  # no two apps' instances overlap
    placed = sum(len(g.instances) for g in result.layout.gpus)
    assert placed == sum(i.count for p in result.plans.values() for i in p.instances)
    for name, p in result.plans.items():
        assert p.planned_rps == pytest.approx(demands[name])
        assert verify_plan(p, node.app(name), node, profiles) == []
    fewest = plan_node(node.apps, node, profiles, demands, objective="slices", solver="highs",
                       time_limit_s=30)
    assert fewest.feasible and fewest.slices_used <= result.slices_used
    json.loads(result.to_json())


def test_node_plan_above_capacity_serves_a_common_share(example) -> None:
    node, profiles = example
    demands = {"social_media": 8000.0, "traffic_analysis": 1500.0}
    apps = [node.app(n) for n in demands]
    result = plan_node(apps, node, profiles, demands, solver="highs", time_limit_s=30)
    assert not result.feasible and 0 < result.demand_scale < 1
    for name, p in result.plans.items():
        assert p.max_demand_plan
        assert p.planned_rps == pytest.approx(result.demand_scale * demands[name], rel=1e-5)
        assert verify_plan(p, node.app(name), node, profiles) == []


def test_node_plan_rejects_bad_demands(example) -> None:
    node, profiles = example
    with pytest.raises(PlanError):
        plan_node(node.apps, node, profiles, {"social_media": 10.0})
    with pytest.raises(PlanError):
        plan_node(node.apps[:1], node, profiles, {"social_media": -1.0})
    with pytest.raises(PlanError):
        plan_node(node.apps[:1], node, profiles, {"social_media": 1.0, "other": 1.0})


@pytest.mark.parametrize("app_name", ["social_media", "traffic_analysis", "ar_assistant"])
def test_quick_plan_is_verified_and_the_exact_one_is_no_worse(example, app_name: str) -> None:
    node, profiles = example
    app = node.app(app_name)
    quick = quick_plan(app, node, profiles, 60.0)
    assert quick is not None and quick.feasible
    assert verify_plan(quick, app, node, profiles) == []
    plans = list(plan_anytime(app, node, profiles, 60.0, solver="highs", time_limit_s=20))
    assert len(plans) == 2 and plans[0].status == "heuristic"
    assert plans[1].objective >= plans[0].objective - 1e-9


def test_quick_plan_gives_up_above_capacity() -> None:
    app = make_app(**TINY, latency_slo_ms=120.0)
    node = make_node(num_gpus=1)
    profiles = make_profiles(node, {"a1": 2.0, "a2": 6.0, "b1": 3.0})
    assert quick_plan(app, node, profiles, 1e7) is None


def test_node_objective_is_validated(tmp_path: Path) -> None:
    text = NODE.read_text().replace('space = "ast"', 'space = "ast"\nobjective = "fastest"')
    bad = tmp_path / "node.toml"
    bad.write_text(text.replace('"apps/', f'"{NODE.parent}/apps/').replace(
        '"../profiles', f'"{NODE.parent}/../profiles'))
    with pytest.raises(ConfigError, match="objective"):
        load_node(bad)


def test_cli_node_plan_json() -> None:
    proc = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--node", str(NODE), "--demand",
                           "social_media=1000,ar_assistant=50", "--solver", "highs", "--time-limit", "30",
                           "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["plans"]) == {"social_media", "ar_assistant"}
    assert data["slices_used"] == sum(p["slices_used"] for p in data["plans"].values())
    apps_placed = {i["app"] for g in data["layout"] for i in g["instances"]}
    assert apps_placed == {"social_media", "ar_assistant"}
    bad = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--node", str(NODE), "--demand",
                          "social_media=lots"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "social_media" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("demand", [20.0, 60.0, 150.0])
def test_level_models_bracket_the_reference_optimum(demand: float) -> None:
    """The relaxed level model bounds the full model from above (and is at most the core's
    bound); the restricted level model's plans are feasible, so its optimum lies below."""
    from jigsaw.planner import joint
    from jigsaw.planner.problem import make_problem
    from jigsaw.spaces import search_space

    app, node, profiles = _chain()
    ref = plan(app, node, profiles, demand, solver="highs", formulation="reference", time_limit_s=60)
    if not (ref.feasible and ref.status == "optimal"):
        pytest.skip(f"reference not proven ({ref.status})")
    pb = make_problem(app, node, profiles, search_space("ast"), None)
    parts = [joint.Part(pb, demand)]
    core = joint.build(parts, node, full=False).model.solve("highs", 60, 1e-9)
    # levels from the fastest latencies up: the needed caps of a plan that takes the slowest
    lats = joint.task_latencies(pb)
    need = {t: ls[-1] for t, ls in lats.items()}
    levels = joint.candidate_levels(pb, need, joint._feasible_caps(pb, need), per_task=3)
    assert all(lev == sorted(lev) and lev[-1] == lats[t][-1] for t, lev in levels.items())
    relaxed = joint.build(parts, node, full=False, levels=[levels], relax_levels=True)
    rsol = relaxed.model.solve("highs", 60, 1e-9)
    assert rsol.status == "optimal"
    assert ref.objective <= rsol.objective + 1e-6
    assert rsol.objective <= core.objective + 1e-6
    restricted = joint.build(parts, node, full=False, levels=[levels])
    xsol = restricted.model.solve("highs", 60, 1e-9)
    if xsol.has_incumbent:
        assert xsol.objective <= ref.objective + 1e-6
        cols, _ = joint._lift(restricted, xsol.values, 0)
        assert cols is not None  # every level choice it makes meets the paths
    # splitting below the caps a path cannot take cuts the relaxed solution off
    refined = joint.refine_levels(pb, levels, need)
    if any(sum(2 * need[t] for t in p) > app.latency_slo_ms for p in app.paths):
        assert refined is not None and any(len(refined[t]) > len(levels[t]) for t in levels)


def test_plan_right_at_capacity_starts_from_the_capacity_plan(example) -> None:
    """At 100% of capacity the greedy plan finds nothing; the capacity's plan (its lanes scaled
    to the demand) is a start the exact solve proves or improves, never a plan without a gap."""
    node, profiles = example
    app = node.app("traffic_analysis")
    cap = capacity(app, node, profiles, solver="highs", time_limit_s=60)
    assert cap.status == "optimal"
    p = plan(app, node, profiles, cap.max_demand_rps, solver="cbc", time_limit_s=60, start=cap.plan)
    assert p.feasible and not p.max_demand_plan and p.status == "optimal" and p.gap == 0.0
    assert p.planned_rps == pytest.approx(cap.max_demand_rps)
    assert p.objective >= cap.plan.objective - node.absolute_gap
    assert verify_plan(p, app, node, profiles) == []


def test_problems_are_remembered_until_the_profile_table_changes() -> None:
    """``make_problem`` is pure: the same inputs give the same (shared) problem, and a profile
    table that gains a row gives a new one built from it."""
    import dataclasses
    from pathlib import Path

    from jigsaw.node import load_node, load_node_profiles
    from jigsaw.planner.problem import forget, make_problem
    from jigsaw.spaces import search_space

    node = load_node(Path(__file__).resolve().parents[1] / "examples" / "h100x4.toml")
    profiles = load_node_profiles(node)
    app, sp = node.app("social_media"), search_space("ast")
    first = make_problem(app, node, profiles, sp, None)
    assert make_problem(app, node, profiles, sp, None) is first
    assert make_problem(app, node.with_gpus(2), profiles, sp, None) is not first
    row = profiles.rows()[0]
    profiles.add(dataclasses.replace(row, throughput_rps=row.throughput_rps * 2))
    again = make_problem(app, node, profiles, sp, None)
    assert again is not first
    forget()
    assert make_problem(app, node, profiles, sp, None) is not again
