"""MPS shares of MIG instances (``jigsaw.shares``): k processes of different (task, variant)s in
one MIG instance, from the node file through rows, count vectors, the packer, the node layout and
the verifier; the homogeneous segment stays a special case. On the example H100 node."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from jigsaw.errors import ConfigError
from jigsaw.gpu.layout import NodeInstance, NodeLayout, devices, place_app, validate_node_layout
from jigsaw.gpu.partition import overlaps
from jigsaw.mig import gpu_model, share_host, share_level, slice_unit, with_mig_shares
from jigsaw.node import load_node, load_node_profiles
from jigsaw.plan import GpuLayout, Layout
from jigsaw.planner.layouts import layout_counts, maximal_layout_counts, placement_violations
from jigsaw.planner.milp import plan
from jigsaw.planner.node_plan import plan_node
from jigsaw.planner.packer import (
    InstanceRequest,
    changed_gpus,
    pack,
    to_mig_parted_yaml,
    to_nvidia_smi_commands,
    validate_layout,
)
from jigsaw.planner.verify import verify_plan
from jigsaw.profiles import ProfileRow, ProfileTable
from jigsaw.shares import SHARE_INTERFERENCE, with_share_rows

ROOT = Path(__file__).resolve().parents[1]
SHARES = '["1g.10gb-1of2", "1g.10gb-1of4"]'
H100 = with_mig_shares(gpu_model("H100-80GB"), [2, 4], ["1g.10gb"])


def _node(tmp_path: Path, shares: str | None = SHARES, count: int = 4, milp: bool = False) -> Path:
    """examples/h100x4.toml with ``count`` GPUs and ``mig_shares`` (None: the default; "[]": none);
    ``milp``: the shares among the MILPs' own profiles too (``mig_profiles``)."""
    text = (ROOT / "examples" / "h100x4.toml").read_text()
    text = text.replace('"apps/', f'"{ROOT}/examples/apps/').replace('"../profiles', f'"{ROOT}/profiles')
    own = (*gpu_model("H100-80GB").profile_names, "1g.10gb-1of2", "1g.10gb-1of4")
    text = text.replace("count = 4\n", f"count = {count}\n" + (f"mig_shares = {shares}\n" if shares else "")
                        + (f"mig_profiles = {json.dumps(list(own))}\n" if milp else ""))
    path = tmp_path / f"h100-{count}-{shares}-{milp}.toml"
    path.write_text(text)
    return path


def test_the_node_file_names_the_shared_instances(tmp_path: Path) -> None:
    node = load_node(_node(tmp_path))
    share = node.gpu.profile("1g.10gb-1of4")
    assert (share.host, share.share_of, share.size, share.starts) == ("1g.10gb", 4, 1, tuple(range(7)))
    assert share.memory_gb == 2.5 and share.slice_cost == 0.25 and share.slot_cost == 0.25
    assert share_host("1g.10gb-1of4") == "1g.10gb" and share_level("1g.10gb-1of4") == 4
    assert share_host("gpu-1of4") == "" and share_level("7g.80gb") == 0
    # the MILPs plan without them (the share pass adds them: ``planner/share_merge.py``) unless the
    # file lists them among mig_profiles
    assert slice_unit(node.gpu, node.mig_profiles) == 1 and node.slices_available == 28
    listed = load_node(_node(tmp_path, milp=True))
    assert slice_unit(listed.gpu, listed.mig_profiles) == 4
    assert load_node(_node(tmp_path, "[]")).gpu.profile_names == gpu_model("H100-80GB").profile_names
    default = load_node(_node(tmp_path, None)).gpu
    assert [p.name for p in default.profiles if p.host] == ["1g.10gb-1of2", "1g.10gb-1of3", "1g.10gb-1of4"]
    for bad, why in (('["2g.20gb-1of5"]', "k in"), ('["9g.1gb-1of2"]', "H100-80GB table"),
                     ('["1g.10gb-1of2-1of2"]', "H100-80GB table")):
        with pytest.raises(ConfigError, match=why) as err:
            load_node(_node(tmp_path, bad))
        assert err.value.field == "gpus.mig_shares[0]"
    path = _node(tmp_path)
    path.write_text(path.read_text().replace("mps_levels = [1, 2, 3, 4]", "mps_levels = [1, 2]"))
    with pytest.raises(ConfigError, match="mps_levels"):
        load_node(path)


def test_share_rows_come_from_the_instances_level_k_rows() -> None:
    pair = ProfileRow("v", "1g.10gb", 2, 8, 30.0, 400.0, 900.0, "modeled")
    table = with_share_rows(ProfileTable([pair, replace(pair, mps=1)]), H100)
    row = table.get("v", "1g.10gb-1of2", 1, 8)
    assert row.throughput_rps == pytest.approx(200.0 * SHARE_INTERFERENCE, abs=1e-3)
    assert row.latency_ms == pytest.approx(30.0 / SHARE_INTERFERENCE, abs=1e-4) and row.memory_mb == 900.0
    assert table.get("v", "1g.10gb-1of4", 1, 8) is None  # no level-4 row to derive it from
    measured = replace(row, throughput_rps=123.0, backend="measured")
    assert with_share_rows(ProfileTable([pair, measured]), H100).get("v", "1g.10gb-1of2", 1, 8) == measured


def test_a_share_has_no_slots_of_its_own() -> None:
    """Count vectors and placements are over devices: a share is counted as its host's instance
    (the MILPs: k shares to an instance, ``problem.share_hosts``)."""
    with pytest.raises(ValueError, match="no slots of its own"):
        layout_counts(H100, ["1g.10gb-1of2"])
    assert set(maximal_layout_counts(H100, ["1g.10gb", "3g.40gb"])) == {(7, 0), (4, 1), (0, 2)}


def test_placement_rules_see_the_instance_its_shares_sit_in() -> None:
    assert placement_violations(H100, [("1g.10gb-1of2", 0)] * 2 + [("3g.40gb", 4)]) == []
    assert "3 processes share" in placement_violations(H100, [("1g.10gb-1of2", 0)] * 3)[0]
    two = [("1g.10gb-1of2", 0), ("1g.10gb-1of4", 0)]  # two instances at one start
    assert any("overlaps" in p for p in placement_violations(H100, two))
    assert any("overlaps" in p for p in placement_violations(H100, [("1g.10gb-1of2", 4), ("3g.40gb", 4)]))


def _shares(*tasks: str, profile: str = "1g.10gb-1of2") -> list[InstanceRequest]:
    return [InstanceRequest(profile, t, f"v{t}", 1, 8, 0) for t in tasks]


def test_the_packer_lays_up_to_k_shares_into_one_instance_and_keeps_them() -> None:
    asked = [*_shares("a", "b", "c"), *_shares("d", "e", "f", "g", "h", profile="1g.10gb-1of4"),
             InstanceRequest("3g.40gb", "x", "vx", 2, 8, 0)]
    layout = pack(asked, H100, 1)
    assert validate_layout(layout, H100) == []
    by_instance: dict[tuple[int, str], list[int]] = defaultdict(list)
    for p in layout.gpus[0].instances:
        by_instance[(p.start, p.profile)].append(p.seat)
    assert sorted(len(s) for (_, n), s in by_instance.items() if n == "1g.10gb-1of2") == [1, 2]
    assert sorted(len(s) for (_, n), s in by_instance.items() if n == "1g.10gb-1of4") == [1, 4]
    assert all(sorted(s) == list(range(len(s))) for s in by_instance.values())
    assert Counter(n for n, _ in layout.gpus[0].signature) == {"1g.10gb": 4, "3g.40gb": 1}
    # what NVML is asked for: the instances, each once, of their profile
    cmds = [c for c in to_nvidia_smi_commands(layout) if "-cgi" in c]
    assert len(cmds) == 5 and not any("-1of" in c for c in cmds)
    assert '"1g.10gb": 4' in to_mig_parted_yaml(layout) and "1of" not in to_mig_parted_yaml(layout)
    # the same shares again: every one keeps its instance and seat, nothing is repartitioned
    again = pack(list(reversed(asked)), H100, 1, layout)
    assert again == layout and changed_gpus(layout, again) == []
    # a share swapped for another task keeps the instance (a seat changes hands, no NVML call)
    swapped = pack([*_shares("a", "b", "z"), *asked[3:]], H100, 1, layout)
    assert changed_gpus(layout, swapped) == []
    seat_of = {p.task: (p.start, p.seat) for p in swapped.gpus[0].instances}
    assert all(seat_of[t] == (p.start, p.seat) for p in layout.gpus[0].instances
               if (t := p.task) in seat_of)
    bad = Layout(H100.name, (GpuLayout(0, tuple(replace(p, seat=0) for p in layout.gpus[0].instances)),))
    assert any("seat 0 taken twice" in p for p in validate_layout(bad, H100))
    # a new share fills the free seat of an instance whose shares all stay: nothing moves (a
    # burst's plan extends what runs)
    more = pack([*asked, *_shares("y", profile="1g.10gb-1of4")], H100, 1, layout)
    assert changed_gpus(layout, more) == []
    placed = {(p.start, p.profile, p.task, p.seat) for p in more.gpus[0].instances}
    assert {(p.start, p.profile, p.task, p.seat) for p in layout.gpus[0].instances} <= placed


def test_shares_pay_where_small_tasks_waste_whole_instances(tmp_path: Path) -> None:
    """Each app at a small demand: with shares its plan takes fewer slices (tasks of it share
    instances), verified; without them the plan is what it was (the special case)."""
    shared, plain = load_node(_node(tmp_path)), load_node(_node(tmp_path, "[]"))
    app = shared.app("traffic_analysis")
    with_shares = plan(app, shared, load_node_profiles(shared), 40.0)
    without = plan(app, plain, load_node_profiles(plain), 40.0)
    assert with_shares.feasible and without.feasible
    assert with_shares.slices_used < without.slices_used
    assert any(share_level(i.mig_profile) for i in with_shares.instances)
    assert verify_plan(with_shares, app, shared, load_node_profiles(shared)) == []
    tasks_in: dict[tuple[int, int], set[str]] = defaultdict(set)
    for g in with_shares.layout.gpus:
        for p in g.instances:
            if share_host(p.profile):
                tasks_in[(g.gpu, p.start)].add(p.task)
    assert max(len(t) for t in tasks_in.values()) >= 2  # different tasks in one MIG instance
    broken = replace(with_shares.layout, gpus=tuple(
        replace(g, instances=tuple(replace(p, seat=5) for p in g.instances))
        for g in with_shares.layout.gpus))
    assert any("seats" in p for p in verify_plan(replace(with_shares, layout=broken), app, shared,
                                                 load_node_profiles(shared)))


def test_a_node_plan_puts_different_apps_into_one_instance(tmp_path: Path) -> None:
    """One H100 holds the three apps' eight tasks only through shares: in the MILPs where the file
    lists them among its profiles (the share pass needs a homogeneous plan to start from)."""
    node = load_node(_node(tmp_path, count=1, milp=True))
    profiles = load_node_profiles(node)
    result = plan_node(list(node.apps), node, profiles, {a.name: 20.0 for a in node.apps})
    assert result.status in ("optimal", "feasible") and result.slices_used <= 7
    for a in node.apps:
        assert verify_plan(result.plans[a.name], a, node, profiles) == []
    apps_in: dict[tuple[int, int], set[str]] = defaultdict(set)
    for g in result.layout.gpus:
        for p in g.instances:
            apps_in[(g.gpu, p.start)].add(p.app)
    assert max(len(a) for a in apps_in.values()) >= 2


def test_an_apps_shares_take_the_free_seats_of_a_running_instance() -> None:
    """Placed against what runs: a share of a new plan sits down beside another app's share in its
    running instance (no new MIG instance, its MPS daemon runs); the rest gets new instances."""
    theirs = NodeInstance(0, "1g.10gb-1of2", 6, "other", "t", "v", 1, 8, 0, seat=0)
    running = NodeLayout(H100.name, 1, (theirs,))
    placed = place_app(running, "mine", _shares("a", "b"), H100)
    assert validate_node_layout(placed, H100) == []
    mine = sorted((i.start, i.seat) for i in placed.of_app("mine"))
    assert (6, 1) in mine and len(devices(placed.instances)) == 2
    other = placed.of_app("other")[0]
    joined = next(i for i in placed.of_app("mine") if i.start == 6)
    new = next(i for i in placed.of_app("mine") if i.start != 6)
    assert not overlaps(H100, joined, other) and overlaps(H100, replace(joined, seat=0), other)
    assert joined.device_slot == other.device_slot == (0, 6, "1g.10gb") and joined.slot != other.slot
    assert new.as_device().profile == "1g.10gb"
    # the instance itself (the partition's record) is where the share lies, not in its way; a share
    # of another level at its start or an instance over its slot is
    assert not overlaps(H100, joined, joined.as_device())
    assert overlaps(H100, replace(joined, profile="1g.10gb-1of4"), other)
    assert overlaps(H100, joined, NodeInstance(0, "2g.20gb", 6, "x"))


def test_the_shares_of_a_kind_in_one_instance_are_distinct_processes(tmp_path: Path) -> None:
    """Two shares of one (task, variant) in one MIG instance are two processes across re-plans
    (``Generation.process_keys``): the same seats keep both, another instance keeps none."""
    from jigsaw.backends.registry import backend_kind
    from jigsaw.plan import PlacedInstance, PlanInstance
    from jigsaw.runtime.generation import Generation

    node = load_node(_node(tmp_path, count=1))
    app, profiles = node.app("traffic_analysis"), load_node_profiles(node)
    base = plan(app, node, profiles, 40.0)
    share = next(i for i in base.instances if share_level(i.mig_profile))
    doubled = [replace(i, count=2) if i is share else i for i in base.instances]

    def laid(start: int, gid: int) -> Generation:
        others = [p for g in base.layout.gpus for p in g.instances
                  if (p.task, p.variant, p.profile) != (share.task, share.variant, share.mig_profile)]
        mine = [PlacedInstance(share.mig_profile, start, share.task, share.variant, n, 1, share.max_batch,
                               seat=n) for n in range(2)]
        p = replace(base, instances=[PlanInstance(**{**i.__dict__}) for i in doubled],
                    layout=Layout(node.gpu.name, (GpuLayout(0, tuple([*others, *mine])),)))
        (tmp_path / str(gid)).mkdir()
        return Generation(gid, node, app, p, profiles, run_dir=tmp_path / str(gid), daemon_id="t",
                          frontend_bell="bell", time_scale=1.0, seed=0, backend=backend_kind("emulated"))

    free = [s for s in range(7) if all(p.start != s for g in base.layout.gpus for p in g.instances)]
    keys = laid(free[0], 1).process_keys()
    assert len(set(keys)) == len(keys)
    assert laid(free[0], 2).process_keys() == keys
    mine = {k for k in keys if k[0] == share.task and k[2] == share.mig_profile}
    assert len(mine) == 2 and not mine & set(laid(free[1], 3).process_keys())


def test_a_plan_with_shares_survives_its_json_and_packs_without_its_node(tmp_path: Path, capsys) -> None:
    """The plan file carries each share's seat; ``jigsaw pack`` without ``--node`` knows the shares
    from the plan's profiles and asks NVML for their instances only."""
    from jigsaw.cli import main
    from jigsaw.plan import Plan

    node = load_node(_node(tmp_path, count=1))
    result = plan(node.app("traffic_analysis"), node, load_node_profiles(node), 40.0)
    path = tmp_path / "plan.json"
    path.write_text(result.to_json())
    back = Plan.from_json_dict(json.loads(path.read_text()))
    assert back.layout == result.layout and any(p.seat for g in back.layout.gpus for p in g.instances)
    assert main(["pack", "--plan", str(path), "--format", "commands"]) == 0
    cmds = [c for c in capsys.readouterr().out.splitlines() if "-cgi" in c]
    assert cmds and not any("-1of" in c for c in cmds)
    assert len(cmds) == len(result.layout.gpus[0].signature)


def test_a_share_placed_beside_what_runs_sits_in_a_running_instances_free_seat() -> None:
    """``Beside`` (a needed plan placed beside everything that runs and the partition's instances):
    an app's new share takes the free seat of a running shared instance, whose MIG instance the
    partition holds, with no drain and nothing created."""
    from jigsaw.plan import Plan, PlanInstance
    from jigsaw.runtime.placement import Beside

    theirs = NodeInstance(0, "1g.10gb-1of2", 6, "other", "t", "v", 1, 8, 0, seat=0)
    layout = NodeLayout(H100.name, 1, (theirs,))
    share = PlanInstance(task="a", variant="va", mig_profile="1g.10gb-1of2", mps=1, max_batch=8, count=1,
                         latency_ms=1.0, throughput_rps=1.0, slices=0.5)
    mine = Plan(app="mine", space="ast", demand_rps=1.0, planned_rps=1.0, feasible=True,
                max_demand_plan=False, status="optimal", objective=0.0, accuracy=1.0, slices_used=0.5,
                slices_available=7, solve_seconds=0.0, gap=0.0, instances=[share])
    got = Beside(layout, (theirs, theirs.as_device()), H100).place("mine", mine)
    assert got is not None
    placed, laid = got
    assert [(i.start, i.seat) for i in placed.of_app("mine")] == [(6, 1)]
    assert laid.layout is not None and validate_node_layout(placed, H100) == []


def test_the_default_node_merges_idle_tails_into_shares(tmp_path: Path) -> None:
    """The default node (shares on, ``share_merge``): at a small demand the node plan is the
    homogeneous one with the same lanes, status and rates, on fewer slices, every app verified;
    some instance holds processes of different tasks."""
    node, plain = load_node(_node(tmp_path, None)), load_node(_node(tmp_path, "[]"))
    profiles = load_node_profiles(node)
    demands = {"social_media": 48.0, "traffic_analysis": 8.0, "ar_assistant": 17.0}
    got = plan_node(list(node.apps), node, profiles, demands)
    base = plan_node(list(plain.apps), plain, load_node_profiles(plain), demands)
    assert got.status == base.status == "optimal" and got.feasible and got.demand_scale == 1.0
    assert got.slices_used < base.slices_used and any("merged" in n for n in got.notes)
    for a in node.apps:
        mine, theirs = got.plans[a.name], base.plans[a.name]
        assert verify_plan(mine, a, node, profiles) == []
        assert mine.lanes == theirs.lanes and mine.planned_rps == theirs.planned_rps
    tasks_in: dict[tuple[int, int], set[tuple[str, str]]] = defaultdict(set)
    for g in got.layout.gpus:
        for p in g.instances:
            tasks_in[(g.gpu, p.start)].add((p.app, p.task))
    assert max(len(t) for t in tasks_in.values()) >= 2


def test_a_lane_with_a_tiny_rate_still_runs_every_task_it_reaches(tmp_path: Path) -> None:
    """A lane of 0.01 rps needs an instance of every (task, variant) it sends to: the cover row
    scaled by the largest throughput let the solver drop one within its tolerance (one H100, three
    apps at 20 rps each: a scaled plan at 0.05% that sent classify to a variant it did not run)."""
    from jigsaw.planner import joint
    from jigsaw.planner.problem import make_problem
    from jigsaw.spaces import search_space

    node = load_node(_node(tmp_path, "[]", count=1))
    app = node.app("social_media")
    pb = make_problem(app, node, load_node_profiles(node), search_space("ast"), None)
    for rate in (0.0105, 0.05):
        got = joint.solve([joint.Part(pb, rate, 1.0)], node, solver="cbc", time_limit_s=10,
                          objective="slices")
        p = got.plans[0]
        assert p is not None and {i.task for i in p.instances} == set(app.task_names)
    # the node plan of the three apps' eight tasks on the one GPU's seven slices, without shares:
    # nothing fits at any demand, said at once (it was a "scaled" plan serving 0.05% with that lane)
    result = plan_node(list(node.apps), node, load_node_profiles(node), {a.name: 20.0 for a in node.apps})
    assert result.status == "infeasible" and not result.plans and result.demand_scale == 0.0
    assert "8 slices at the cheapest, and the node has 7" in result.notes[0]
