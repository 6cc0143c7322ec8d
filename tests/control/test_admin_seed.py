"""``POST /admin/control`` with a seeded history and ``restart_bins``: the history the controller
predicts from is the seed, whatever bins closed while the seeded re-plan ran.

A bin that closed during that re-plan appended its demand after the seed; every later bin's index
in the history was then one ahead of the trace's, and the recurring-spike predictor planned each
of the trace's spikes a bin early and the spike bin itself for the quiet level (a replay's
violations differed several-fold between runs with the timing)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from jigsaw.control.admin import CONTROLLERS_KEY, GENERATIONS_KEY, h_control


class _Controller:
    """The ``AppController`` calls the handler makes; its re-plan closes a bin, as a slow one may."""

    def __init__(self) -> None:
        self.history_rps: deque[float] = deque()
        self.predicted_rps = 0.0
        self.plan = None

    class _Predictor:
        @staticmethod
        def predict(history: list[float]) -> float:
            return history[-1]

    predictor = _Predictor()

    async def replan(self, demand: float, *, as_asked: bool = False) -> None:
        self.predicted_rps = demand
        self.history_rps.append(0.0)  # the bin that was running closed meanwhile (no arrivals)

    def restart_bins(self, history_rps: list[float] | None = None) -> None:
        if history_rps is not None:
            self.history_rps.clear()
            self.history_rps.extend(float(x) for x in history_rps)


class _Generations:
    apps = ("app",)

    @staticmethod
    def generation_of(app: str) -> int:
        return 1


def test_a_bin_closed_during_the_seeded_replan_does_not_shift_the_history(monkeypatch: Any) -> None:
    import jigsaw.control.admin as admin

    monkeypatch.setattr(admin, "plan_summary", lambda plan: {})
    ctl = _Controller()

    async def go() -> dict[str, Any]:
        app = web.Application()
        app[CONTROLLERS_KEY] = {"app": ctl}  # type: ignore[dict-item]
        app[GENERATIONS_KEY] = _Generations()  # type: ignore[assignment]
        app.router.add_post("/admin/control", h_control)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            resp = await client.post("/admin/control", json={"app": "app", "history_rps": [5, 6, 7],
                                                             "restart_bins": True})
            assert resp.status == 200, await resp.text()
            return await resp.json()

    asyncio.run(go())
    assert list(ctl.history_rps) == [5.0, 6.0, 7.0]
    assert ctl.predicted_rps == 7.0
