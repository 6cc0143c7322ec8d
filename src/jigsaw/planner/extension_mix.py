"""The lane mixes a running plan's extension may serve its added demand on: the running lanes kept
at the rates they carry, the rest on the lanes that cost the fewest slices per request within
the accuracy SLO (``anytime.extend_plan`` tries each and keeps the cheapest extension).

Why: the extension kept the running plan's mix, scaled to the new demand. A plan for a quiet
bin spends its spare slices on accuracy (ar_assistant at 127 req/s: yolov5x -> git-large ->
vits only, accuracy 1.0), so a spike's extensions grew that mix: 21 slices for 335 req/s, where
the exact plan serves 538 req/s on 21 slices at accuracy 0.90 (its SLO). On day 0 the chain of
extensions of the spike at bin 114 ended at 25 slices for 416 req/s, no memory slot left, and
the arrivals (720-820 req/s) queued past their deadline. The added demand is what a spike
needs served: it goes where a slice serves the most, as the exact plan's would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from jigsaw.planner.columns import Column
from jigsaw.planner.problem import Problem

CHEAPEST_LANES = 3  # lanes (by slices per request) the added demand is tried on alone
BELOW_SLO_LANES = 2  # cheaper lanes below the accuracy SLO tried mixed up to it


def lane_costs(pb: Problem, cost: Callable[[Column], float]) -> list[float]:
    """Per lane of ``pb``: the slices (priced by ``cost``) a root request per second costs on it
    at its tasks' best columns per slice, latency aside (the ranking ``added_mixes`` tries)."""
    per_tv: dict[tuple[str, str], float] = {}
    for c in pb.colset.columns:
        if c.throughput_rps > 0:
            k = (c.task, c.variant)
            per_tv[k] = min(per_tv.get(k, math.inf), cost(c) / c.throughput_rps)
    names = pb.app.task_names
    return [sum(pb.lane_mult[li][t] * per_tv.get((t, lane[k]), math.inf) for k, t in enumerate(names))
            for li, lane in enumerate(pb.lanes)]


def added_mixes(pb: Problem, running: Mapping[int, float], rate: float, slo_acc: float,
                costs: list[float]) -> list[dict[int, float]]:
    """Lane mixes at ``rate``: ``running`` (lane -> rate it carries) kept, the rest added on one of
    the ``CHEAPEST_LANES`` cheapest lanes (``costs``) that keep the mix's accuracy at
    ``slo_acc``, or on one of the ``BELOW_SLO_LANES`` cheaper ones below it, mixed with the
    cheapest of those up to the SLO. Empty when ``running`` carries ``rate`` already."""
    extra = rate - sum(running.values())
    if extra <= 1e-9 * max(1.0, rate):
        return []
    held = sum(pb.lane_acc[li] * x for li, x in running.items())
    need = slo_acc * rate - held  # accuracy-weighted rate the added demand must bring

    def acc_ok(li: int) -> bool:
        return pb.lane_acc[li] * extra >= need - 1e-9 * rate

    order = sorted((li for li in range(len(pb.lanes)) if math.isfinite(costs[li])), key=lambda li: costs[li])
    ok = [li for li in order if acc_ok(li)]
    out = [_plus(running, {li: extra}) for li in ok[:CHEAPEST_LANES]]
    if not ok:
        return out
    anchor = ok[0]
    cheaper = [li for li in order if not acc_ok(li) and costs[li] < costs[anchor]]
    for li in cheaper[:BELOW_SLO_LANES]:
        # x on ``li``, the rest on the anchor: acc_li * x + acc_anchor * (extra - x) = need
        gap = pb.lane_acc[anchor] - pb.lane_acc[li]
        x = (pb.lane_acc[anchor] * extra - need) / gap if gap > 0 else 0.0
        x = min(extra, max(0.0, x))
        if x > 1e-9 * rate:
            out.append(_plus(running, {li: x, anchor: extra - x}))
    return out


def _plus(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    out = dict(a)
    for k, v in b.items():
        if v > 0:
            out[k] = out.get(k, 0.0) + v
    return out
