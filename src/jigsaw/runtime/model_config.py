"""An app's model configuration in Triton's schema (``GET /v2/models/{app}/config``, gRPC ModelConfig).

A jigsaw app is a pipeline of tasks, so it is described as Triton describes an ensemble:
platform ``ensemble``, ``max_batch_size`` 0 (the app's inputs are shaped per request; each
task batches on its own), the app's inputs and the sink tasks' outputs, and
``ensemble_scheduling.step``: one step per task in topological order, its ``model_name``
``{app}.{task}`` (the composing model the statistics report), its ``input_map`` from the app's
inputs (a root task) or from its parents' items (``{parent}.items``), its ``output_map`` to its
items (``{task}.items``) or, for a sink, to the app's outputs (``{task}.{output}``).

What Triton's schema has no field for is in the ``jigsaw`` section (the HTTP document's own key,
and, as JSON text, the ``jigsaw`` entry of ``parameters``, which the gRPC ModelConfig carries):
each task's kind and variants (accuracy), the edges (factor per variant, transform), the SLO,
and the running plan's choices (per instance: variant, segment, MPS level, max batch, count;
the lanes and their rates). Pure: the frontend passes what it serves.
"""

from __future__ import annotations

import json
from typing import Any

from jigsaw.app import App
from jigsaw.plan import Plan

TYPE_NAMES = {"BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
              "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
              "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
              "BF16": "TYPE_BF16", "BYTES": "TYPE_STRING"}


def _tensor(name: str, datatype: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": TYPE_NAMES.get(datatype, "TYPE_INVALID"), "dims": dims}


def _steps(app: App, outputs: dict[str, list[tuple[str, str, list[int]]]]) -> list[dict[str, Any]]:
    steps = []
    for task in app.topological_order:
        parents = app.parents(task)
        if parents:
            input_map = {p: f"{p}.items" for p in parents}
        else:
            input_map = {s.name: s.name for s in app.inputs}
        if task in outputs:
            output_map = {name.split(".", 1)[1]: name for name, _, _ in outputs[task]}
        else:
            output_map = {"items": f"{task}.items"}
        steps.append({"model_name": f"{app.name}.{task}", "model_version": -1,
                      "input_map": input_map, "output_map": output_map})
    return steps


def _jigsaw_section(app: App, plan: Plan | None, generation: int, backend: str) -> dict[str, Any]:
    section: dict[str, Any] = {
        "backend": backend, "latency_slo_ms": app.latency_slo_ms,
        "tasks": [{"name": t.name, "kind": t.kind,
                   "variants": [{"name": v.name, "accuracy": v.accuracy} for v in t.variants]}
                  for t in app.tasks],
        "edges": [{"from": e.src, "to": e.dst, "factors": dict(e.factors), "transform": e.transform}
                  for e in app.edges],
    }
    if plan is not None:
        section["plan"] = {
            "generation": generation, "demand_rps": plan.demand_rps, "planned_rps": plan.planned_rps,
            "accuracy": plan.accuracy, "slices_used": plan.slices_used,
            "instances": [{"task": i.task, "variant": i.variant, "mig_profile": i.mig_profile, "mps": i.mps,
                           "max_batch": i.max_batch, "count": i.count} for i in plan.instances],
            "lanes": [{"variants": dict(lane.variants), "rate_rps": lane.rate_rps} for lane in plan.lanes],
        }
    return section


def model_config(app: App, outputs: dict[str, list[tuple[str, str, list[int]]]], plan: Plan | None, *,
                 generation: int = 0, backend: str = "") -> dict[str, Any]:
    """Triton's ``ModelConfig`` JSON of ``app``; ``outputs``: sink task -> (``task.name``, datatype,
    dims) of each output, ``plan``: the running plan (None: not serving)."""
    section = _jigsaw_section(app, plan, generation, backend)
    return {
        "name": app.name, "platform": "ensemble", "backend": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [_tensor(s.name, s.datatype, list(s.shape)) for s in app.inputs],
        "output": [_tensor(name, dt, dims) for specs in outputs.values() for name, dt, dims in specs],
        "ensemble_scheduling": {"step": _steps(app, outputs)},
        "parameters": {"jigsaw": {"string_value": json.dumps(section, separators=(",", ":"))}},
        "jigsaw": section,
    }
