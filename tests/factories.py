"""Small apps, nodes and profiles built in code, for planner tests (vLLM's create_* style)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from jigsaw.app import App, Edge, Task, Variant
from jigsaw.mig import gpu_model
from jigsaw.node import Node, PlannerSettings
from jigsaw.profiles import ProfileRow, ProfileTable


def make_app(tasks: dict[str, list[tuple[str, float]]], edges: list[tuple[str, str, dict[str, float]]]
             = (), latency_slo_ms: float = 200.0, accuracy_slo: float | None = None,
             name: str = "tiny") -> App:
    """``tasks``: task -> [(variant, accuracy)]; ``edges``: (src, dst, {src variant: factor})."""
    return App(
        name=name,
        tasks=tuple(Task(t, "generic", tuple(Variant(v, a) for v, a in vs)) for t, vs in tasks.items()),
        edges=tuple(Edge(s, d, dict(f)) for s, d, f in edges),
        latency_slo_ms=latency_slo_ms,
        accuracy_slo=accuracy_slo,
    )


def make_node(num_gpus: int = 1, mig_profiles: tuple[str, ...] = ("1g.10gb", "2g.20gb", "3g.40gb",
                                                                   "4g.40gb", "7g.80gb"),
              mps_levels: tuple[int, ...] = (1,), batch_sizes: tuple[int, ...] = (1, 4),
              accuracy_slo: float = 0.9, time_limit_s: float = 60.0, **planner: object) -> Node:
    return Node(
        name="test", gpu=gpu_model("H100-80GB"), num_gpus=num_gpus, mig_profiles=mig_profiles,
        mps_levels=mps_levels, batch_sizes=batch_sizes, profiles_dir=Path("."), backend="emulated",
        planner=PlannerSettings(accuracy_slo=accuracy_slo, time_limit_s=time_limit_s,
                                absolute_gap=1e-9, **planner),  # type: ignore[arg-type]
    )


def make_profiles(node: Node, base_ms: dict[str, float], memory_mb: float = 500.0) -> ProfileTable:
    """A simple, plausible model: per-item time scales with 1/compute share, batching amortises
    a fixed overhead, MPS adds throughput with some interference."""
    rows = []
    for variant, item_ms in base_ms.items():
        for name in node.mig_profiles:
            prof = node.gpu.profile(name)
            share = prof.compute_slices / 7
            for k in node.mps_levels:
                for b in node.batch_sizes:
                    latency = (2.0 + b * item_ms / share ** 0.8) * (1 + 0.3 * (k - 1))
                    rows.append(ProfileRow(variant, name, k, b, latency, k * b * 1000.0 / latency,
                                           memory_mb + 20.0 * b, "modeled"))
    return ProfileTable(rows, "factories")


def latency_bound_chain() -> tuple[App, Node, ProfileTable]:
    """A three-task chain where latency binds: the largest batches of every task do not fit the SLO
    together, so the planner has to split the SLO among the tasks (the split searches' test case)."""
    app = make_app(
        tasks={"a": [("a1", 70.0), ("a2", 80.0)], "b": [("b1", 60.0), ("b2", 66.0)], "c": [("c1", 50.0)]},
        edges=[("a", "b", {"a1": 1.0, "a2": 1.5}), ("b", "c", {"b1": 0.5, "b2": 0.8})],
        latency_slo_ms=160.0,
    )
    node = make_node(num_gpus=2, mps_levels=(1, 2), batch_sizes=(1, 4, 16))
    return app, node, make_profiles(node, {"a1": 2.0, "a2": 5.0, "b1": 3.0, "b2": 7.0, "c1": 1.0})


def count_answers(dispatcher: Any) -> Counter[int]:
    """Counts the answers the dispatcher gives each request (by object id), to assert that every
    accepted request is answered exactly once across a reconfiguration."""
    answers: Counter[int] = Counter()
    finish = dispatcher._finish

    def counting_finish(req: Any, *args: Any) -> None:
        answers[id(req)] += 1
        finish(req, *args)

    dispatcher._finish = counting_finish
    return answers


def one_task_routes(generation: int = 0, **settings: Any) -> Any:
    """One task's routes (app ``x``): 2 instances of 200 req/s, a 40 ms batch, a 200 ms SLO, an
    in-flight limit of 64; ``settings`` sets ``AppRoutes`` fields (``admission_backlog=True``...)."""
    from jigsaw.app import TensorSpec
    from jigsaw.plan import Plan, PlanInstance
    from jigsaw.runtime.topology import AppRoutes

    app = App("x", (Task("a", "classifier", (Variant("v", 1.0),)),), (), latency_slo_ms=200.0,
              inputs=(TensorSpec("image", "UINT8", (-1,)),))
    plan = Plan(app="x", space="ast", demand_rps=300, planned_rps=300, feasible=True, max_demand_plan=False,
                status="optimal", objective=0.0, accuracy=1.0, slices_used=2, slices_available=7,
                solve_seconds=0.0, gap=0.0,
                instances=[PlanInstance("a", "v", "1g.10gb", 1, 8, 2, 40.0, 200.0, 1)],
                task_latency_ms={"a": 40.0})
    return AppRoutes(app=app, app_index=0, lanes=[{"a": "v"}], lane_weights=[1.0], roots=[{}],
                     depth=1, slices=2, plan=plan, generation=generation, **settings)
