"""A node plan says ``optimal`` only with a proof, at and above the node's capacity; where both
formulations prove it, they agree on the fraction served and the objective (one GPU, two apps:
small enough for the joint model to prove; HiGHS, generous limits on a shared machine)."""

from __future__ import annotations

import dataclasses

import pytest

from jigsaw.planner import joint, node_plan
from jigsaw.planner.node_plan import plan_node
from jigsaw.planner.scaled import SCALE_TOLERANCE
from jigsaw.planner.verify import verify_plan

NAMES = ("social_media", "traffic_analysis")
BASE = {"social_media": 1500.0, "traffic_analysis": 400.0}  # the node serves 37.6% of it


def _plan(one_gpu, factor: float, form: str, **kw):
    node, profiles = one_gpu
    demands = {k: v * factor for k, v in BASE.items()}
    return plan_node([node.app(a) for a in NAMES], node, profiles, demands, solver="highs",
                     time_limit_s=60, formulation=form, **kw)


@pytest.mark.parametrize("factor", [0.37, 0.6])  # 98% and 160% of the node's capacity
def test_the_formulations_agree_where_both_prove_it(one_gpu, factor: float) -> None:
    # without MIG-instance shares: the two formulations' optima may differ among equals, and the share
    # pass over each (``share_merge``) may then free different slices
    node, profiles = one_gpu
    node = dataclasses.replace(node, gpu=dataclasses.replace(node.gpu, profiles=node.gpu.devices))
    one_gpu = (node, profiles)
    dec, jnt = _plan(one_gpu, factor, "decomposed"), _plan(one_gpu, factor, "joint")
    for res in (dec, jnt):
        assert res.plans and all(p.instances for p in res.plans.values()), res.notes
        for name, p in res.plans.items():
            assert verify_plan(p, node.app(name), node, profiles) == [], name
        assert res.demand_scale <= res.scale_bound
        if res.status == "optimal":  # a proof of the fraction, and of the objective there
            assert res.gap == 0 and res.scale_bound == pytest.approx(res.demand_scale, rel=1e-6)
    assert jnt.status == "optimal", jnt.notes
    if factor < 0.376:  # the demands fit: both prove the same optimum
        assert dec.status == "optimal" and dec.demand_scale == jnt.demand_scale == 1.0
        assert dec.objective == pytest.approx(jnt.objective, abs=node.absolute_gap + 1e-9)
        return
    # above the node: the joint's proven fraction lies where the decomposition's search put it
    assert dec.demand_scale <= jnt.demand_scale * (1 + 1e-6)
    assert jnt.demand_scale <= dec.scale_bound * (1 + 1e-6)
    assert dec.scale_bound <= dec.demand_scale * (1 + SCALE_TOLERANCE) * (1 + 1e-6)
    # its plans are the first that pack at that fraction: a plan, not a proven optimum
    assert dec.status == "feasible"
    assert dec.objective <= jnt.objective + node.absolute_gap + 1e-9 or \
        dec.demand_scale < jnt.demand_scale * (1 - 1e-6)


def test_a_stopped_capacity_model_is_not_an_optimal_fraction(one_gpu, monkeypatch) -> None:
    """The joint formulation above the node: where its capacity model stops at the limit (the
    three example apps at 115% on a loaded machine), the plans at the fraction it found are a
    plan with the capacity model's bound, not 'optimal'; a stop with nothing served is no
    solution, not 'infeasible at any demand'."""
    real = joint.solve

    def stopped(parts, node, **kw):
        res = real(parts, node, **kw)
        if kw.get("scale_demands"):
            return dataclasses.replace(res, status="feasible", bound=res.objective * 1.05)
        return res

    monkeypatch.setattr(node_plan.joint, "solve", stopped)
    res = _plan(one_gpu, 1.0, "joint")
    assert res.status == "feasible" and 0 < res.demand_scale < 1
    assert res.scale_bound == pytest.approx(res.demand_scale * 1.05, rel=1e-3)
    assert all(p.status != "optimal" for p in res.plans.values())
    assert any("not proven the largest" in n for n in res.notes)

    def nothing(parts, node, **kw):
        res = real(parts, node, **kw)
        if kw.get("scale_demands"):
            return dataclasses.replace(res, status="feasible", plans=[None] * len(parts))
        return res

    monkeypatch.setattr(node_plan.joint, "solve", nothing)
    res = _plan(one_gpu, 1.0, "joint")
    assert res.status == "no_solution" and not res.plans
