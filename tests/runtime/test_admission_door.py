"""The admission door over its in-flight limit: a 503 only when the queue says the request is late.

Controlled emulated latencies: the routing table's measured queue (``queued_end_s``) and the
processes' batch rates are set by the test, not timed.
"""

from __future__ import annotations

import json

from factories import one_task_routes

from jigsaw.runtime import stats as st
from jigsaw.runtime.admission import QUEUE_ADMIT_SHARE, Admission
from jigsaw.runtime.http import Answer, OipHttp, ServingState
from jigsaw.runtime.lanes import LaneShape, Stage, soonest_end_s
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.topology import AppRoutes

BODY = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], "data": [1]}]}).encode()
SLO_MS = 200.0


def _routes(*, backlog: bool) -> AppRoutes:
    """One task, 2 instances of 200 req/s, a 40 ms batch, a 200 ms SLO: an in-flight limit of 64."""
    return one_task_routes(3, admission_per_generation=True, admission_backlog=backlog)


class _Routing:
    """The routing table as the door reads it: the routes and the measured queue ahead."""

    def __init__(self, routes: AppRoutes) -> None:
        self.routes = {"x": routes}
        self.output_specs: dict[str, dict[str, list[object]]] = {"x": {}}
        self.end_s: float | None = 0.0

    def queued_end_s(self, routes: AppRoutes) -> float | None:
        return self.end_s


class _Dispatcher:
    """Admits what it is handed (as ``Dispatcher.submit`` does) and gives the SLO as the budget."""

    def __init__(self, door: Admission) -> None:
        self.door = door
        self.submitted = 0

    def budget_ns(self, routes: AppRoutes, timeout_us: int | None = None) -> int:
        return int(SLO_MS * 1e6) if timeout_us is None else min(int(SLO_MS * 1e6), timeout_us * 1000)

    def submit(self, routes: AppRoutes, *args: object, **kwargs: object) -> object:
        self.submitted += 1
        self.door.admit(routes.app.name, routes.generation)
        return object()


def _door(*, backlog: bool, max_queue: int = 4096) -> tuple[OipHttp, _Routing, _Dispatcher, Admission]:
    routes = _routes(backlog=backlog)
    door = Admission(max_queue)
    door.refresh(routes, [])
    routing = _Routing(routes)
    dispatcher = _Dispatcher(door)
    http = OipHttp(routing, door, dispatcher, Metrics("emulated"), ServingState(ready=True),  # type: ignore[arg-type]
                   backend_name="emulated")
    return http, routing, dispatcher, door


def _fill(door: Admission, n: int, generation: int = 3) -> None:
    for _ in range(n):
        door.admit("x", generation)


def test_a_request_over_the_limit_is_admitted_when_the_queue_ahead_leaves_time_for_its_deadline():
    """The count says full (64 of 64 in flight, e.g. requests past the root or a re-sent backlog)
    but the processes' queues hold 50 ms of work on a 200 ms deadline: the request is served, not
    shed. The same queue at 170 ms (past 0.75 of the deadline) sheds it, and so does the count alone
    with ``server.admission_backlog`` off."""
    http, routing, dispatcher, door = _door(backlog=True)
    assert door.limit("x") == 64
    _fill(door, 64)
    routing.end_s = 0.05
    got = http.infer_begin(routing.routes["x"], BODY, None)
    assert not isinstance(got, Answer), got
    assert dispatcher.submitted == 1 and door.over_limit["x"] == [0, 1]

    routing.end_s = 0.17  # past QUEUE_ADMIT_SHARE of the 0.2 s deadline: it would be late
    assert QUEUE_ADMIT_SHARE * SLO_MS / 1000.0 < 0.17
    got = http.infer_begin(routing.routes["x"], BODY, None)
    assert isinstance(got, Answer) and got.status == 503 and "in flight" in got.doc["error"]
    assert dispatcher.submitted == 1 and door.over_limit["x"] == [1, 1]

    routing.end_s = None  # no lane with live processes: nothing says it would make it
    got = http.infer_begin(routing.routes["x"], BODY, None)
    assert isinstance(got, Answer) and got.status == 503

    off, routing_off, dispatcher_off, door_off = _door(backlog=False)
    _fill(door_off, 64)
    routing_off.end_s = 0.0
    got = off.infer_begin(routing_off.routes["x"], BODY, None)
    assert isinstance(got, Answer) and got.status == 503 and dispatcher_off.submitted == 0


def test_the_queue_does_not_lift_max_queue_or_a_tight_timeout():
    """``max_queue`` bounds every request of the app whatever the queue; an OIP ``timeout`` is the
    deadline the queue is held against."""
    http, routing, dispatcher, door = _door(backlog=True, max_queue=70)
    _fill(door, 6, generation=2)  # an older generation's backlog: counts only against max_queue
    _fill(door, 64)
    routing.end_s = 0.0
    got = http.infer_begin(routing.routes["x"], BODY, None)
    assert isinstance(got, Answer) and got.status == 503 and dispatcher.submitted == 0

    http, routing, dispatcher, door = _door(backlog=True)
    _fill(door, 64)
    routing.end_s = 0.05
    tight = json.loads(BODY)
    tight["parameters"] = {"timeout": 60_000}  # 60 ms: 50 ms of queue is past 0.75 of it
    got = http.infer_begin(routing.routes["x"], json.dumps(tight).encode(), None)
    assert isinstance(got, Answer) and got.status == 503 and dispatcher.submitted == 0


def test_soonest_end_is_the_queue_ahead_over_the_batch_rate_plus_the_fastest_path():
    """Two lanes of a two-task path: lane 0's stages finish 100 and 50 items/s, lane 1's 200 and
    100. With 10 items queued at each process the ends are 10/100 + 10/50 + 0.05 = 0.35 s and
    10/200 + 10/100 + 0.02 = 0.17 s: a shift may take either (the sooner counts), the plan's draw
    only the lanes it gives a rate (the later of them counts); a lane with no live process, none."""
    shape = LaneShape(lanes=[[[Stage((0,), 100.0), Stage((1,), 50.0)]],
                             [[Stage((2,), 200.0), Stage((3,), 100.0)]]],
                      runs=[True, True], min_path_s=[0.05, 0.02])
    queued = {0: 10, 1: 10, 2: 10, 3: 10}
    alive = {0: st.READY, 1: st.READY, 2: st.READY, 3: st.READY}
    end = soonest_end_s(shape, queued.__getitem__, alive.__getitem__, [1.0, 1.0], any_lane=True)
    assert end is not None and abs(end - 0.17) < 1e-9
    end = soonest_end_s(shape, queued.__getitem__, alive.__getitem__, [1.0, 1.0], any_lane=False)
    assert end is not None and abs(end - 0.35) < 1e-9
    end = soonest_end_s(shape, queued.__getitem__, alive.__getitem__, [0.0, 1.0], any_lane=False)
    assert end is not None and abs(end - 0.17) < 1e-9
    alive[2] = st.FAILED  # lane 1 has no live process at its root: only lane 0 may take it
    end = soonest_end_s(shape, queued.__getitem__, alive.__getitem__, [1.0, 1.0], any_lane=True)
    assert end is not None and abs(end - 0.35) < 1e-9
    alive[0] = st.DEAD
    assert soonest_end_s(shape, queued.__getitem__, alive.__getitem__, [1.0, 1.0], any_lane=True) is None


def test_a_cut_drain_sends_again_only_what_the_serving_plans_queue_leaves_time_for():
    """A drain cut short (a drain-first in a spike): its unanswered requests are sent again on the
    serving plan oldest first while the queue there, which each one sent again lengthens (here by
    1 s), leaves it time (``QUEUE_ADMIT_SHARE`` of the 10.5 s it has left: 7.9 s); the rest
    are answered 504 at once instead of filling the plan's queue and door until their deadline. With
    ``server.admission_backlog`` off, every one is sent again."""
    import asyncio
    import time

    from jigsaw.runtime.dispatch import Dispatcher, Pending

    async def cut(backlog: bool) -> tuple[tuple[int, int, int], list[int], Admission]:
        routes = _routes(backlog=backlog)
        door = Admission(4096)
        door.refresh(routes, [])
        routing = _Routing(routes)
        routing.fastest_path_ns = lambda r: 0  # type: ignore[attr-defined]
        d = Dispatcher(routing, door, Metrics("emulated"), backend_name="emulated",  # type: ignore[arg-type]
                       emulated=True)
        d._loop = asyncio.get_running_loop()
        old = _routes(backlog=backlog)
        old.generation = 2
        now = time.monotonic_ns()
        for k in range(12):
            req = Pending(k, old, 0, None, now, now + 10_500_000_000, d._loop.create_future(), None)
            req.generation = 2
            d.pending[k] = req
            door.admit("x", 2)
        sent: list[int] = []

        def again(req: Pending, to: AppRoutes) -> None:
            sent.append(req.request_id)
            req.routes, req.generation = to, to.generation
            door.moved("x", 2, to.generation)
            routing.end_s = (routing.end_s or 0.0) + 1.0  # its items now queue ahead of the next
        d._dispatch_again = again  # type: ignore[method-assign]
        return d.cut_generation(2), sent, door

    (forgotten, resent, failed), sent, door = asyncio.run(cut(backlog=True))
    assert (forgotten, resent, failed) == (0, 8, 4) and sent == list(range(8))
    assert door.by_generation["x"] == {3: 8}  # the 4 answered 504 are out of the door's count
    (forgotten, resent, failed), sent, door = asyncio.run(cut(backlog=False))
    assert (forgotten, resent, failed) == (0, 12, 0) and door.by_generation["x"] == {3: 12}


def test_the_queue_ahead_counts_the_rings_of_the_tasks_past_the_root() -> None:
    """A task's queue stays in its input rings until its process can batch them (the batching
    queue holds one batch): a two-task chain whose root (slot 0) has 4 records in the frontend's
    ring and 3 batched, and whose second task (slot 1, 20 items/s) 2 batched and 30 in its rings.
    The estimate counts those 30 (``stats.RING_QUEUED``, as the process published them) at 20
    items/s: 1.6 s more than the 0.1 s that the second task's batch alone said."""
    from jigsaw.runtime.routing import MappedGeneration, _queued

    words = {(0, st.QUEUED): 3, (0, st.RING_QUEUED): 99, (1, st.QUEUED): 2, (1, st.RING_QUEUED): 30}

    class Block:
        def get(self, slot: int, word: int) -> int:
            return words.get((slot, word), st.READY if word == st.STATE else 0)

    mapped = MappedGeneration(None, {}, {}, [], Block(), root_rings={0: [b""] * 4})  # type: ignore[arg-type]
    queued = _queued(mapped)
    # the root's ring read live (what it published of it is older), the rest as published
    assert queued(0) == 3 + 4 and queued(1) == 2 + 30
    shape = LaneShape(lanes=[[[Stage((0,), 70.0), Stage((1,), 20.0)]]], runs=[True], min_path_s=[0.2])
    end = soonest_end_s(shape, queued, lambda slot: st.READY, [1.0], any_lane=False)
    assert end is not None and abs(end - (7 / 70.0 + 32 / 20.0 + 0.2)) < 1e-9
