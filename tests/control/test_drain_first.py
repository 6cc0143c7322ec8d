"""Drain first: a re-plan whose new MIG instance needs the slots of running ones, on a full GPU.

The generation manager is driven directly (a real frontend, real worker processes, the emulated
NVML) with hand-made plans, so the layout is known: seven 1g.10gb instances fill the GPU, the new
plan swaps two of ``b``'s for one 2g.20gb instance of ``b``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from dpserver import write_tiny
from factories import count_answers

from jigsaw.backends.registry import backend_kind
from jigsaw.control.transition import NEEDED, MakeRoom, Need, RoomPolicy, transit
from jigsaw.gpu.layout import validate_node_layout
from jigsaw.node import load_node
from jigsaw.plan import Plan
from jigsaw.runtime import stats as st
from jigsaw.runtime.applied import (
    Applied,
    CutDrains,
    DrainFirst,
    RoomSnapshot,
    RoomStep,
    TakeSlots,
    WaitForDrains,
)
from jigsaw.runtime.frontend import Frontend
from jigsaw.runtime.generations import DesiredState, GenerationManager, Placed


def _plans(tmp_path: Path, task: str = "b", counts: tuple[int, int] = (2, 5),
           kept: int = 3, b_ms: float = 1.0, latency_slo_ms: float = 200.0,
           control: str = "", a_ms: float = 1.0) -> tuple[Path, Plan, Plan]:
    """7 x 1g.10gb (``counts`` of a and b: the GPU is full), then ``task`` on ``kept`` of them
    and one 2g.20gb instance. ``a_ms``, ``b_ms``: a's and b's latency per item; ``control``:
    ``[control]`` lines."""
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: a_ms}, 1), ("b", "classifier", {1: b_ms}, 1)],
                      edges=[("a", "b", 1.0)], counts={"a": counts[0], "b": counts[1]},
                      latency_slo_ms=latency_slo_ms)
    node_path, plan_path = Path(args[1]), Path(args[3])
    if control:
        node_path.write_text(node_path.read_text() + "[control]\n" + control)
    csv = node_path.parent / "profiles" / "tiny.csv"
    csv.write_text(csv.read_text() + f"{task}-v,2g.20gb,1,1,1.0,1000.000,100,modeled,,,\n")
    doc = json.loads(plan_path.read_text())
    first = Plan.from_json_dict(doc)
    t = next(i for i in first.instances if i.task == task)
    second = dataclasses.replace(first, instances=[
        *(i for i in first.instances if i.task != task), dataclasses.replace(t, count=kept),
        dataclasses.replace(t, mig_profile="2g.20gb", count=1, slices=2)])
    return node_path, first, second


def _serving(node_path: Path, first: Plan) -> tuple[Any, Any, GenerationManager, Frontend, list[str]]:
    """The node, its one app, a manager serving ``first`` on the emulated backend (its log kept) and a
    frontend for it: the set-up every drain-first test starts from."""
    node = load_node(node_path)
    app = node.apps[0]
    logs: list[str] = []
    gm = GenerationManager(node, [(app, first)], time_scale=1.0, seed=0, backend=backend_kind("emulated"),
                           log=logs.append)
    return node, app, gm, Frontend(gm.backend, hop_latency_ms=0.0), logs


async def _apply(gm: GenerationManager, desired: DesiredState, room: RoomPolicy | None = None,
                 need: Callable[[], Need] = Need) -> Applied:
    """Move the app to ``desired`` as the controller does (``transition.transit``: ``room``
    decides each step, by default the node's making-room policy; ``need``: what it knows)."""
    done, _ = await transit(gm, desired, room or MakeRoom(gm.node.control.drain_wait_slo), need)
    return done


def test_new_instance_needing_running_slots_drains_them_first(tmp_path: Path) -> None:
    node_path, first, second = _plans(tmp_path)
    node, app, gm, fe, logs = _serving(node_path, first)
    try:
        gm.start_all(timeout_s=60)
        before = gm.node_layout
        assert before is not None and len(before.instances) == 7  # the GPU is full
        pids0 = {p["pid"]: (p["task"], p["profile"], p["start"]) for p in gm.processes()}
        nvml = gm.partition.applier.nvml  # type: ignore[union-attr]
        calls0 = len(nvml.calls)

        async def go() -> None:
            gm.attach(fe)
            fe.start(asyncio.get_running_loop())
            try:
                done = await _apply(gm, DesiredState(app.name, second))
                assert done.error is None and done.new_generation, (done, logs)
                for _ in range(200):  # the new plan's old generation drains in the background
                    if len(gm.generations) == 1:
                        break
                    await asyncio.sleep(0.05)
                await gm.stop_retiring()
            finally:
                fe.close()

        asyncio.run(go())
        after = gm.node_layout
        assert after is not None
        assert validate_node_layout(after, node.gpu) == []
        assert any("draining those first while the rest serves" in line for line in logs), logs
        assert gm.current[app.name] == 2  # generation 1 served while b's two instances drained
        assert list(gm.generations) == [2]
        # the processes of the instances the new plan keeps are the same ones
        now = {p["pid"]: (p["task"], p["profile"], p["start"]) for p in gm.processes()}
        kept = {pid for pid in now if pid in pids0}
        assert len(kept) == 5 and all(now[pid] == pids0[pid] for pid in kept)  # a x2, b x3 (1g.10gb)
        assert [v for v in now.values() if v[1] == "2g.20gb"]
        # NVML: the two instances in the way destroyed, then the 2g.20gb one created
        changes = [c[0] for c in nvml.calls[calls0:] if c[0] in
                   ("nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement")]
        assert changes == ["nvmlGpuInstanceDestroy"] * 2 + ["nvmlDeviceCreateGpuInstanceWithPlacement"], \
            changes
        existing = gm.partition.existing.values()  # type: ignore[union-attr]
        assert {i.slot for i in existing} == {i.slot for i in after.instances}
    finally:
        gm.close()


def _needed_once(tmp_path: Path, control: str, needed: bool) -> tuple[Any, list[str], int, int]:
    """The drain-first scenario above, pushed as a needed plan the rate does (``needed``) or no
    longer needs (``Need.still_needed``): (what the transition did, the log, how often the policy
    read it, NVML instances destroyed or created)."""
    node_path, first, second = _plans(tmp_path, control=control)
    asked: list[bool] = []

    def still_needed() -> Need:
        asked.append(needed)
        return Need(still_needed=needed)

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        nvml = gm.partition.applier.nvml  # type: ignore[union-attr]
        calls0 = len(nvml.calls)
        out["done"] = await _apply(gm, DesiredState(app.name, second), need=still_needed)
        # every NVML change: a plan kept out before anything changed creates none either
        out["destroyed"] = sum(c[0] in ("nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstanceWithPlacement")
                               for c in nvml.calls[calls0:])
    out = _under_load(node_path, first, scenario)
    return out["done"], out["logs"], len(asked), out["destroyed"]


def test_a_needed_plan_that_the_rate_no_longer_needs_drains_nothing(tmp_path: Path) -> None:
    """Before draining the two running instances in its way, the re-plan asks whether it is still
    needed (``DesiredState.still_needed``); told no (the spike it was for has passed, the running
    plan holds what arrives now), it creates and destroys no instance and the running generation
    serves on. (Still needed, the drain-first goes on: ``test_transition.py``, and executed in
    ``test_new_instance_needing_running_slots_drains_them_first``.)"""
    done, logs, asked, destroyed = _needed_once(tmp_path / "passed", "", needed=False)
    assert asked and not done.new_generation and done.error is None, (done, logs)
    assert done.generation == 0 and "the rate now arriving is one the running plan holds" in (done.note or "")
    assert destroyed == 0 and not any("draining those first" in line for line in logs), logs


def test_keep_all_replan_rewires_the_running_processes(tmp_path: Path) -> None:
    # the same instances with another planned task latency: a new routing generation on the same
    # processes (no process started), told by SIGHUP to serve its rings; the old one retires
    node_path, first, _ = _plans(tmp_path)
    slower = {t: 2 * ms for t, ms in first.task_latency_ms.items()}
    second = dataclasses.replace(first, task_latency_ms=slower)
    node = load_node(node_path)
    app = node.apps[0]
    gm = GenerationManager(node, [(app, first)], time_scale=1.0, seed=0, backend=backend_kind("emulated"))
    fe = Frontend(gm.backend, hop_latency_ms=0.0)
    try:
        gm.start_all(timeout_s=60)
        pids0 = sorted(p["pid"] for p in gm.processes())
        calls0 = len(gm.partition.applier.nvml.calls)  # type: ignore[union-attr]

        async def go() -> None:
            gm.attach(fe)
            fe.start(asyncio.get_running_loop())
            try:
                done = await _apply(gm, DesiredState(app.name, second))
                assert done.new_generation and done.error is None
                assert (done.kept, done.started) == (7, 0), done
                for _ in range(200):
                    if len(gm.generations) == 1:
                        break
                    await asyncio.sleep(0.05)
            finally:
                fe.close()

        asyncio.run(go())
        assert list(gm.generations) == [1]
        assert sorted(p["pid"] for p in gm.processes()) == pids0
        assert all(p["generations"] == [1] for p in gm.processes())
        assert len(gm.partition.applier.nvml.calls) == calls0  # type: ignore[union-attr]
        g = gm.generations[1]
        assert not g.not_ready() and all(w.poll() is None for w in g.workers)
    finally:
        gm.close()


Submit = Callable[[int], list[Any]]  # n requests accepted
Scenario = Callable[[GenerationManager, Any, Submit, dict[str, Any]], Awaitable[None]]


def _keep_all(tmp_path: Path, b_ms: float, slo_ms: float = 20000.0) -> tuple[Path, Plan, Plan]:
    """The node, the first plan (b: ``b_ms`` an item, SLO ``slo_ms``) and a plan of the same
    instances with another planned latency: a re-plan that keeps every process."""
    node_path, first, _ = _plans(tmp_path, b_ms=b_ms, latency_slo_ms=slo_ms)
    slower = {t: 2 * ms for t, ms in first.task_latency_ms.items()}
    return node_path, first, dataclasses.replace(first, task_latency_ms=slower)


def _under_load(node_path: Path, first: Plan, scenario: Scenario) -> dict[str, Any]:
    """Serve ``first`` (``_serving``) and run ``scenario(gm, app, submit, out)`` on the frontend's
    loop (``submit(n)``: n requests accepted); returns ``out`` with the logs, the answers each
    request got and the pids running at the start and the end."""
    _node, app, gm, fe, logs = _serving(node_path, first)
    answers = count_answers(fe.dispatcher)  # request (object id) -> answers given
    out: dict[str, Any] = {"logs": logs}
    image = [("image", "UINT8", (4,), np.zeros(4, np.uint8))]

    def submit(n: int) -> list[Any]:
        sent = [fe.dispatcher.submit(fe.routing.routes[app.name], None, image, None) for _ in range(n)]
        assert not any(isinstance(got, str) for got in sent), sent
        return sent

    try:
        gm.start_all(timeout_s=60)
        out["pids_before"] = {p["pid"] for p in gm.processes()}

        async def go() -> None:
            gm.attach(fe)
            fe.start(asyncio.get_running_loop())
            try:
                await scenario(gm, app, submit, out)
                await gm.stop_retiring()
            finally:
                fe.close()

        asyncio.run(go())
        out["answers"] = answers
        out["pids_after"] = {p["pid"] for p in gm.processes()}
        out["generations"] = list(gm.generations)
    finally:
        gm.close()
    return out


def test_a_kept_process_mid_batch_does_not_hold_the_switch(tmp_path: Path) -> None:
    # b's batch lasts 3 s; a keep-all re-plan comes while it runs: every process is told to serve
    # the new generation and the routing switches while the batch still runs (the batch's stamp is
    # in the kept process's new slot at the switch); its request is then answered once, 200
    node_path, first, second = _keep_all(tmp_path, 3000.0)

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        (sent,) = submit(1)
        g1 = gm.generations[gm.current[app.name]]
        assert g1.stats is not None
        running = []
        for _ in range(500):  # until b's batch runs
            running = [j for j, p in enumerate(g1.topology.processes)
                       if p.task == "b" and g1.stats.get(p.slot, st.BATCH_STARTED_NS)]
            if running:
                break
            await asyncio.sleep(0.01)
        assert running, "b's batch never started"
        done = out["done"] = await _apply(gm, DesiredState(app.name, second))
        g2 = gm.generations[done.generation]
        assert g2.stats is not None
        k = next(k for k, (old, j) in g2.adopted.items() if old is g1 and j == running[0])
        out["batch_started_at_switch"] = g2.stats.get(g2.topology.processes[k].slot, st.BATCH_STARTED_NS)
        out["answered_at_switch"] = sent.future.done()
        out["status"] = (await asyncio.wait_for(sent.future, 30))[0]

    out = _under_load(node_path, first, scenario)
    done = out["done"]
    assert done.new_generation and done.error is None and (done.kept, done.started) == (7, 0), out
    assert out["batch_started_at_switch"] > 0 and not out["answered_at_switch"], out
    assert out["status"] == 200 and list(out["answers"].values()) == [1], out


def test_a_retiring_generation_gives_an_older_draining_one_back_the_processes_it_kept(tmp_path: Path) -> None:
    # 80 requests queued on b (1 s an item on five processes: 16 s of work, longer than C's seven
    # process starts take on a loaded 2-core machine) in generation A; a
    # keep-all re-plan (B) and then a fresh one (C, no process kept) come at once. B, which holds
    # no request, retires first: the processes it kept from A still hold A's queued items, so they
    # go back to A instead of stopping, and every request is answered once, 200, before its
    # deadline (40 s); A stops them when it retires, nothing is left running but C's
    node_path, first, second = _keep_all(tmp_path, 1000.0, slo_ms=40000.0)

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        sent = submit(80)
        out["b"] = await _apply(gm, DesiredState(app.name, second))
        out["c"] = await _apply(gm, DesiredState(app.name, first, fresh_generation=True))
        results = await asyncio.wait_for(asyncio.gather(*(r.future for r in sent)), 60)
        out["statuses"] = Counter(status for status, _ in results)
        for _ in range(400):  # A retires once its requests are answered
            if len(gm.generations) == 1:
                break
            await asyncio.sleep(0.05)

    out = _under_load(node_path, first, scenario)
    logs = out["logs"]
    assert (out["b"].kept, out["c"].kept, out["c"].started) == (7, 0, 7), out
    drained = [line for line in logs if " drained in " in line]
    assert [line.split()[2] for line in drained] == ["1", "0"], logs  # B retired while A drained
    assert out["statuses"] == {200: 80}, out
    assert len(out["answers"]) == 80 and set(out["answers"].values()) == {1}, out["answers"]
    assert out["generations"] == [out["c"].generation], logs
    assert not out["pids_before"] & out["pids_after"]


class _DrainsFirst:
    """A making-room policy that drains the app's instances first whenever something is in the
    way, waiting ``wait_slo`` of the SLO: the drain-first's execution is tested here, the rules
    that decide it in ``test_transition.py``."""

    def __init__(self, wait_slo: float) -> None:
        self.wait_slo = wait_slo

    def decide(self, s: RoomSnapshot, need: Need = NEEDED) -> RoomStep:
        return TakeSlots() if s.deferred == 0 else DrainFirst(self.wait_slo * s.drain_budget_s)


def _drain_first_under_load(tmp_path: Path, wait_slo: float) -> dict[str, Any]:
    """40 requests queued on ``b`` (0.5 s an item on five processes: 4 s of work), then the re-plan
    whose 2g.20gb instance needs two of b's slots (SLO 10 s, time scale 1), drained first."""
    node_path, first, second = _plans(tmp_path, b_ms=500.0, latency_slo_ms=10000.0)

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        sent = submit(40)
        out["done"] = await _apply(gm, DesiredState(app.name, second), _DrainsFirst(wait_slo))
        results = await asyncio.wait_for(asyncio.gather(*(r.future for r in sent)), 60)
        out["statuses"] = Counter(status for status, _ in results)

    return _under_load(node_path, first, scenario)


def test_a_drain_first_waits_a_share_of_the_slo_then_sends_the_rest_again(tmp_path: Path) -> None:
    # 4 s of queued work against a wait of 0.1 x the 10 s SLO: the drain-first does not wait for
    # it (nor for late credits) but sends what is left again on the generation serving meanwhile;
    # every request is answered once, in time
    out = _drain_first_under_load(tmp_path, 0.1)
    done, logs = out["done"], out["logs"]
    assert done.error is None and done.new_generation, (done, logs)
    drained = [line for line in logs if "drained for the new instances" in line]
    assert len(drained) == 1, logs
    resent = int(re.search(r"(\d+) sent again", drained[0]).group(1))  # type: ignore[union-attr]
    assert resent > 0, drained
    assert out["statuses"] == {200: 40}, out["statuses"]
    assert len(out["answers"]) == 40 and set(out["answers"].values()) == {1}, out["answers"]


def test_a_drain_first_with_the_whole_slo_lets_the_queue_finish(tmp_path: Path) -> None:
    out = _drain_first_under_load(tmp_path, 1.0)
    done, logs = out["done"], out["logs"]
    assert done.error is None and done.new_generation, (done, logs)
    drained = [line for line in logs if "drained for the new instances" in line]
    assert len(drained) == 1 and "0 sent again" in drained[0], drained
    assert out["statuses"] == {200: 40}, out["statuses"]


def _needed_over(tmp_path: Path, planned_rps: float, control: str = "", a_ms: float = 1.0,
                 sent_before: int = 20,
                 demand_rps: float | None = None) -> dict[str, Any]:
    """The drain-first scenario with 20 requests sent (``a``: ``a_ms`` an item on two processes;
    ``b``: 0.2 s an item on five; SLO 10 s), the node planned at ``max_utilization`` 0.8, the
    running plan for 1 req/s and the new one pushed as a plan the app needs for ``planned_rps``
    (asked for ``demand_rps`` when given, a plan capped below its demand); with
    ``sent_before`` < 20 the policy waits for drains first (``_WaitsFirst``: 0.2 s of polls) and
    the rest are sent as that wait begins: what the transition did,
    the instances destroyed, the answers' statuses and the manager's ``/metrics``."""
    node_path, first, second = _plans(tmp_path, b_ms=200.0, latency_slo_ms=10000.0, control=control,
                                      a_ms=a_ms)
    text = node_path.read_text()
    node_path.write_text(text.replace("[planner]\n", "[planner]\nmax_utilization = 0.8\n", 1))
    second = dataclasses.replace(second, planned_rps=planned_rps,
                                 demand_rps=second.demand_rps if demand_rps is None else demand_rps)

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        nvml = gm.partition.applier.nvml  # type: ignore[union-attr]
        calls0 = len(nvml.calls)
        sent = submit(sent_before)
        room = MakeRoom(gm.node.control.drain_wait_slo) if sent_before >= 20 else \
            _WaitsFirst(lambda: sent.extend(submit(20 - sent_before)))
        await asyncio.sleep(0.1)
        out["done"] = await _apply(gm, DesiredState(app.name, second), room)
        out["destroyed"] = sum(c[0] == "nvmlGpuInstanceDestroy" for c in nvml.calls[calls0:])
        results = await asyncio.wait_for(asyncio.gather(*(r.future for r in sent)), 60)
        out["statuses"] = Counter(status for status, _ in results)
        out["metrics"] = gm.prometheus()

    return _under_load(node_path, first, scenario)


class _WaitsFirst:
    """The making-room policy, but a wait for drains first (0.2 s of polls) whatever is in the way
    (as when the new instances also need a draining generation's slots), ``at_wait()`` called as
    it begins; then the policy decides on the snapshot after the wait."""

    def __init__(self, at_wait: Callable[[], None]) -> None:
        self.at_wait = at_wait
        self.polls = 0

    def decide(self, s: RoomSnapshot, need: Need = NEEDED) -> RoomStep:
        if s.waited or s.deferred == 0:
            return MakeRoom().decide(s, need)
        if self.polls == 0:
            self.at_wait()
        self.polls += 1
        return WaitForDrains() if self.polls <= 4 else CutDrains()


def _kept_running(out: dict[str, Any], note: str, outcome: str) -> None:
    """The needed plan kept the running plan (``note``, counted as ``outcome``): nothing drained or
    destroyed, every request answered 200 once there."""
    done, logs = out["done"], out["logs"]
    assert not done.new_generation and done.error is None and done.generation == 0, (done, logs)
    assert note in (done.note or ""), done
    assert out["destroyed"] == 0 and not any("draining those first" in line for line in logs), logs
    assert f'jigsaw_reconfig_drain_first_total{{outcome="{outcome}"}} 1' in out["metrics"]
    assert out["statuses"] == {200: 20}, out["statuses"]
    assert len(out["answers"]) == 20 and set(out["answers"].values()) == {1}


def test_a_needed_plan_within_the_running_plans_headroom_drains_nothing(tmp_path: Path) -> None:
    """The headroom rule: a needed plan for 1.2 req/s over a running plan for 1 at
    ``max_utilization`` 0.8 (which serves 1.25 at full utilization) would drain two running
    instances first; with 0.8 s of work queued against a 10 s SLO it keeps the running plan
    instead, destroys nothing, and every queued request is answered 200 there. (A plan for 2
    req/s drains first, and every rule on its own: ``test_transition.py``.)"""
    _kept_running(_needed_over(tmp_path / "small", 1.2),
                  "less than the 1.25 the running plan (for 1.0) serves at full utilization", "headroom")


def test_a_needed_plan_keeps_the_running_plan_while_its_queue_outlasts_the_drain_first_wait(
        tmp_path: Path) -> None:
    """The queue rule: a needed plan for 1.3 req/s (past the running plan's
    1.25 at full utilization; 1.24 arriving under the 5% demand slack) with 4.2 s of work queued
    at the root (``a`` at 0.4 s an item), longer than the drain-first's 2.5 s wait (a quarter of
    the 10 s SLO) and within the door's 7.5 s, keeps the running plan: nothing drained, every
    request answered 200 there (the queue estimate read from the running processes; every rule
    on its own: ``test_transition.py``)."""
    _kept_running(_needed_over(tmp_path / "mid", 1.3, a_ms=400.0),
                  "is longer than a drain-first waits (2.5 s)", "queue")


def test_a_drain_first_is_weighed_again_after_the_wait_for_the_drains_in_its_way(tmp_path: Path) -> None:
    """A needed plan for 1.3 req/s (within the arrivals the queue rule weighs) decided with 0.8 s
    of work queued (4 requests, ``a`` at 0.4 s an item) would drain first; while it waits for
    drains in its way 16 more requests arrive (4.2 s queued, past the drain-first's 2.5 s wait):
    weighed again after the wait, it keeps the running plan, drains nothing and every request is
    answered 200. (Without the late arrivals it drains first: ``test_transition.py``.)"""
    _kept_running(_needed_over(tmp_path / "grew", 1.3, a_ms=400.0, sent_before=4),
                  "within what its door admits after the wait for the drains in its way", "queue")


def test_the_manager_takes_a_placement_made_on_the_node_it_still_has(tmp_path: Path) -> None:
    """A plan the controller placed beside what runs (``Placed``: the node layout and the node it
    saw) is taken as it is while the manager's node is still that one (placed once); placed again
    where the node changed meanwhile. No process is started."""
    node_path, first, _ = _plans(tmp_path, counts=(2, 3))  # five of the seven slots
    node = load_node(node_path)
    app = node.apps[0]
    gm = GenerationManager(node, [(app, first)], time_scale=1.0, seed=0, backend=backend_kind("emulated"))
    try:
        b = next(i for i in first.instances if i.task == "b")
        grown = dataclasses.replace(first, instances=[*(i for i in first.instances if i.task != "b"),
                                                      dataclasses.replace(b, count=b.count + 1)])
        beside = gm.beside()
        assert beside is not None
        got = beside.place(app.name, grown)
        assert got is not None
        layout, laid = got
        desired = DesiredState(app.name, laid, beside=True, placed=Placed(beside, layout))
        taken = gm._place_desired(desired, 0)
        assert isinstance(taken, tuple) and taken[0] is layout and taken[1] is laid
        stale = dataclasses.replace(desired, placed=Placed(dataclasses.replace(beside, held=()), layout))
        again = gm._place_desired(stale, 0)
        assert isinstance(again, tuple) and again[0] is not layout and again[0] == layout
        # placed beside what serves only (it would wait for drains): seen against the same view
        serving = beside.serving_only()
        over = serving.place(app.name, grown)
        assert over is not None
        taken = gm._place_desired(DesiredState(app.name, over[1], beside=True, over_draining=True,
                                               placed=Placed(serving, over[0])), 0)
        assert isinstance(taken, tuple) and taken[0] is over[0]
    finally:
        gm.close()


def test_a_drain_first_ends_the_older_drain_that_holds_the_same_instances(tmp_path: Path) -> None:
    # 40 requests queued on b (0.5 s an item on five processes: 4 s of work) in generation A; a
    # keep-all re-plan (B) takes every process, A drains; then the drain-first whose 2g.20gb
    # instance needs two of b's slots. Those instances are B's and, through the processes B kept,
    # still A's: the drain ends A's hold on them too (its requests waited for, then sent again),
    # so the new plan's instance is created and the running plan is not rolled back. Every
    # request is answered once, 200; the transition says where its time went.
    node_path, first, second = _plans(tmp_path, b_ms=500.0, latency_slo_ms=10000.0)
    slower = dataclasses.replace(first, task_latency_ms={t: 2 * v for t, v in first.task_latency_ms.items()})

    async def scenario(gm: GenerationManager, app: Any, submit: Submit, out: dict[str, Any]) -> None:
        sent = submit(40)
        out["b"] = await _apply(gm, DesiredState(app.name, slower))
        out["done"] = await _apply(gm, DesiredState(app.name, second), _DrainsFirst(0.1))
        results = await asyncio.wait_for(asyncio.gather(*(r.future for r in sent)), 60)
        out["statuses"] = Counter(status for status, _ in results)

    out = _under_load(node_path, first, scenario)
    done, logs = out["done"], out["logs"]
    assert (out["b"].kept, out["b"].started) == (7, 0), out["b"]
    assert done.error is None and done.new_generation and done.restored is None, (done, logs)
    assert not any("still held" in line for line in logs), logs
    assert any("the drains of generation(s) 0 in the new instances' way ended" in line for line in logs), logs
    assert out["statuses"] == {200: 40}, out["statuses"]
    assert len(out["answers"]) == 40 and set(out["answers"].values()) == {1}, out["answers"]
    phases = dict(done.phases_s)
    assert all(phases[k] > 0 for k in ("drain_first", "mig", "spawn", "ready")), phases
    assert sum(phases.values()) <= done.seconds + 0.05, (phases, done.seconds)
