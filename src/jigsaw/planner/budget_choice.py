"""The decomposition's best choice of budgets: a knapsack over what each app's frontier knows.

``decompose`` bounds the node's optimum by the most the apps' single-app values ``g_a(k, m)``
(at most ``k`` compute slices and ``m`` MIG placement slots) can add up to within the node's
slices and slots, with each ``g_a`` replaced by an upper estimate (``estimates``: the bounds
of the budgets solved, the budgets proven infeasible, and the most a plan on more slices can be
worth). This module picks the budgets of that maximum, one per app.

g is nondecreasing in both resources, so a budget is only dominated by one that is no larger in
either: an app whose own optimum takes (8 slices, 12 slots) may well serve its demand on
(9, 10) instead, and a node whose other apps need those two slots fits only so. Each app's
options are therefore

* every budget between its own optimum's usage and that less the node's overrun (the box): the
  budgets a choice cuts an app to (as many as the cut may need, each solved only when chosen);
* every other budget on the node where its estimate rises over each budget one slice or one
  slot smaller (the least budget of each estimate, and of each known plan), e.g. (9, 10) when
  (8, 10) is proven infeasible. A budget with no such rise is dominated by a smaller one, so the
  maximum is the same. A plan on more slices than the own optimum's is worth at most its best
  accuracy less the slices' cost and takes at least a slot per slice (``Shape``): with the
  ``slices`` objective such a budget is worth a slice less than the own optimum, with
  ``accuracy`` up to about three slices more may still look as good until solved.

The box reaches below the own optimum's usage by the overrun plus what the other apps' options
can take above their own optima (``excess``): any choice cut lower can be raised to it and
still fit, so the maximum is the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Usage = tuple[int, int]  # (compute slices, MIG placement slots)
Score = tuple[float, int, int, int]  # (sum of estimates, -unknown budgets, sum of sizes, -spread)


@dataclass(frozen=True)
class Shape:
    """What bounds one app's g without a solve. A plan on more than j slices is worth at most
    ``value0 - beta x j`` (its accuracy term at best, less what its slices cost); every MIG
    profile takes between ``min_slots_per_slice`` and ``max_slots_per_slice`` placement slots per
    compute slice, so a plan on s slices takes at least and at most those times s; ``unit``: the
    parts a slice is counted in (``mig.slice_unit``: a plan's slices are whole in them)."""

    value0: float
    beta: float
    min_slots_per_slice: float
    max_slots_per_slice: float
    unit: int = 1

    def most_slices(self, slots: int) -> int:
        """The slice budget that holds every plan within ``slots`` slots."""
        s = slots / self.min_slots_per_slice
        return math.floor(s + 1e-9) if self.unit == 1 else math.ceil(s - 1e-9)

    def most_slots(self, slices: int) -> int:
        """The slot budget that holds every plan within ``slices`` slices."""
        m = slices * self.max_slots_per_slice
        return math.floor(m + 1e-9) if self.unit == 1 and float(self.max_slots_per_slice).is_integer() \
            else math.ceil(m - 1e-9)


def estimates(budgets_bounds: Sequence[tuple[Usage, float]], refuted: Sequence[Usage], room: Usage,
              shape: Shape) -> np.ndarray:
    """An upper bound on g at every budget within ``room`` (index [k, m]; -inf: no plan).

    ``budgets_bounds``: per budget solved, the bound on g there (it bounds every budget below,
    g being nondecreasing); ``refuted``: budgets with no plan (nor any budget below them).
    ``shape``: a plan on more than k - 1 slices is worth at most its value cap, so g(k, m) <=
    max(g(k - 1, m), value0 - beta (k - 1)); and g(k, m) = g(k', m') for the slices k' and slots
    m' the other resource leaves usable (``Shape.most_slices``, ``most_slots``). Why: a budget with
    more slices than any solved one is bounded otherwise only by the app's own optimum, and
    every such budget would look as good as it, however few its slots."""
    ks, ms = room[0] + 1, room[1] + 1
    ub = np.full((ks, ms), np.inf)
    for (k, m), bound in budgets_bounds:
        k, m = min(k, room[0]), min(m, room[1])
        ub[k, m] = min(ub[k, m], bound)
    ref = np.zeros((ks, ms), dtype=bool)
    for k, m in refuted:
        if k >= 0 and m >= 0:
            ref[min(k, room[0]), min(m, room[1])] = True
    # each cell takes the least bound, and any refutation, of the cells at or above it
    ub = np.minimum.accumulate(np.minimum.accumulate(ub[::-1, ::-1], axis=0), axis=1)[::-1, ::-1]
    ref = np.logical_or.accumulate(np.logical_or.accumulate(ref[::-1, ::-1], axis=0), axis=1)[::-1, ::-1]
    ub[ref] = -np.inf
    for k in range(1, ks):
        ub[k] = np.minimum(ub[k], np.maximum(ub[k - 1], shape.value0 - shape.beta * (k - 1)))
    k_of = np.minimum(np.arange(ks)[:, None],
                      np.array([min(shape.most_slices(m), room[0]) for m in range(ms)])[None, :])
    m_cap = np.array([min(shape.most_slots(k), room[1]) for k in range(ks)])
    m_of = np.minimum(np.arange(ms)[None, :], m_cap[k_of])
    return ub[k_of, m_of]


def known_cells(covers: Sequence[tuple[Usage, Usage]], room: Usage) -> np.ndarray:
    """Whether a solved plan is optimal at each budget (index [k, m]): ``covers`` holds per plan
    its usage and the budget it was solved within (it is optimal for every budget between)."""
    out = np.zeros((room[0] + 1, room[1] + 1), dtype=bool)
    for (uk, um), (bk, bm) in covers:
        out[uk:min(bk, room[0]) + 1, um:min(bm, room[1]) + 1] = True
    return out


def _kept(est: np.ndarray, known: np.ndarray, lo: Usage, hi: Usage) -> np.ndarray:
    """Within [lo, hi]: the budgets not dominated by one a slice or a slot smaller (in [lo, hi])
    with the same estimate, known where this one is. (Estimates are nondecreasing, so one
    dominated by any smaller budget is dominated by a neighbour.)"""
    e = est[lo[0]:hi[0] + 1, lo[1]:hi[1] + 1]
    kn = known[lo[0]:hi[0] + 1, lo[1]:hi[1] + 1]
    left = np.full_like(e, -np.inf)
    left[1:] = e[:-1]
    down = np.full_like(e, -np.inf)
    down[:, 1:] = e[:, :-1]
    kleft = np.zeros_like(kn)
    kleft[1:] = kn[:-1]
    kdown = np.zeros_like(kn)
    kdown[:, 1:] = kn[:, :-1]
    corner = (e > left) & (e > down)
    first_known = kn & ~(kleft & (left == e)) & ~(kdown & (down == e))
    return (corner | first_known) & (e > -np.inf)


def _reach(ests: Sequence[np.ndarray], room: Usage) -> tuple[list[Usage], list[Usage]] | None:
    """Per app the least and the most budget any choice that fits can give it (None: none fits):
    the least with a plan possible at all (every slice; then within the most slices)."""
    lo0: list[int] = []
    for e in ests:
        ok = np.flatnonzero(e[:, room[1]] > -np.inf)
        if not ok.size:
            return None
        lo0.append(int(ok[0]))
    hi0 = [room[0] - (sum(lo0) - x) for x in lo0]
    if any(h < x for h, x in zip(hi0, lo0, strict=True)):
        return None
    lo1: list[int] = []
    for e, h in zip(ests, hi0, strict=True):
        ok = np.flatnonzero(e[h] > -np.inf)
        if not ok.size:
            return None
        lo1.append(int(ok[0]))
    hi1 = [room[1] - (sum(lo1) - x) for x in lo1]
    if any(h < x for h, x in zip(hi1, lo1, strict=True)):
        return None
    return list(zip(lo0, lo1, strict=True)), list(zip(hi0, hi1, strict=True))


def _beyond(top: Usage, lo: Usage, hi: Usage) -> np.ndarray:
    """Within [lo, hi]: the budgets not within the own optimum's usage ``top``."""
    k = np.arange(lo[0], hi[0] + 1)[:, None]
    m = np.arange(lo[1], hi[1] + 1)[None, :]
    return ~((k <= top[0]) & (m <= top[1]))


def options(est: np.ndarray, known: np.ndarray, top: Usage, floor: Usage, lo: Usage, hi: Usage
            ) -> list[tuple[Usage, float, bool, int]]:
    """One app's options at or above ``floor`` (the box's lower end), each (budget, estimate,
    unknown, spread): the box up to ``top``, and the corners beyond it up to ``hi``."""
    out = []
    for k in range(floor[0], min(top[0], hi[0]) + 1):
        for m in range(floor[1], min(top[1], hi[1]) + 1):
            if est[k, m] > -np.inf:
                out.append(((k, m), float(est[k, m]), not known[k, m]))
    if floor[0] <= hi[0] and floor[1] <= hi[1]:
        beyond = _kept(est, known, floor, hi) & _beyond(top, floor, hi)
        for dk, dm in zip(*np.nonzero(beyond), strict=True):
            k, m = floor[0] + int(dk), floor[1] + int(dm)
            out.append(((k, m), float(est[k, m]), not known[k, m]))
    return [(b, ub, unknown, (top[0] - b[0]) ** 2 + (top[1] - b[1]) ** 2) for b, ub, unknown in out]


def excess(est: np.ndarray, known: np.ndarray, top: Usage, lo: Usage, hi: Usage) -> Usage:
    """How far above ``top`` in slices and in slots an option of the app can reach at most."""
    beyond = _kept(est, known, lo, hi) & _beyond(top, lo, hi)
    ks, ms = np.nonzero(beyond)
    if not ks.size:
        return 0, 0
    return max(0, lo[0] + int(ks.max()) - top[0]), max(0, lo[1] + int(ms.max()) - top[1])


def best_choice(ests: Sequence[np.ndarray], knowns: Sequence[np.ndarray], tops: Sequence[Usage],
                room: Usage, resolution: float = 0.0) -> tuple[float, list[Usage]] | None:
    """The most the estimates add up to with sum b <= ``room``, and the budgets b (one per app)
    of a choice that reaches it (None: no choice fits): ties go to fewer unknown budgets, then
    larger budgets (a solved one is an incumbent already), then the overrun spread over the apps
    (each cut a little is likelier feasible than one cut a lot). A knapsack over the apps'
    options (the module doc) in both resources. ``resolution``: sums in the same multiple of it
    tie (a test of whether demands fit asks for plans, and the ``slices`` objective's sums of
    the same slices differ only in their accuracy tie-breaks: the tie-breaks choose better)."""
    reach = _reach(ests, room)
    if reach is None:
        return None
    los, his = reach
    over = [max(0, sum(t[r] for t in tops) - room[r]) for r in (0, 1)]
    ex = [excess(e, kn, t, lo, hi) for e, kn, t, lo, hi in zip(ests, knowns, tops, los, his, strict=True)]
    more = [sum(x[r] for x in ex) for r in (0, 1)]

    def rank(score: Score) -> tuple[float, int, int, int]:
        # sums of the same bounds in another order differ in their last bits: the tie-breaks,
        # not those, decide between them
        first = math.floor(score[0] / resolution) if resolution > 0 else round(score[0], 9)
        return first, score[1], score[2], score[3]

    best: dict[Usage, tuple[Score, list[Usage]]] = {(0, 0): ((0.0, 0, 0, 0), [])}
    most: dict[Usage, float] = {(0, 0): 0.0}  # the largest sum of estimates reaching each usage
    for e, kn, top, lo, hi in zip(ests, knowns, tops, los, his, strict=True):
        floor = (max(lo[0], top[0] - over[0] - more[0]), max(lo[1], top[1] - over[1] - more[1]))
        opts = options(e, kn, top, floor, lo, hi)
        nxt: dict[Usage, tuple[Score, list[Usage]]] = {}
        nxt_most: dict[Usage, float] = {}
        for used, (score, bs) in best.items():
            for b, ub, unknown, spread in opts:
                at = (used[0] + b[0], used[1] + b[1])
                if at[0] > room[0] or at[1] > room[1]:
                    continue
                sc = (score[0] + ub, score[1] - unknown, score[2] + b[0] + b[1], score[3] - spread)
                have = nxt.get(at)
                if have is None or rank(sc) > rank(have[0]):
                    nxt[at] = (sc, [*bs, b])
                nxt_most[at] = max(nxt_most.get(at, -math.inf), most[used] + ub)
        best, most = nxt, nxt_most
        if not best:
            return None
    _, bs = max(best.values(), key=lambda x: rank(x[0]))
    return max(most.values()), bs
