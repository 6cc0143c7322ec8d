"""A re-plan the app needs whose new MIG instance needs a slot a draining generation still holds
waits for that drain to end, then takes the slot: nothing is sent again, every request is answered
once; the wait ends early, changing nothing, when the plan is no longer needed or the arrivals
outgrew it, and a plan whose drain-first would leave the app no lane is refused before it waits.

The generation manager is driven directly (a real frontend, real worker processes, the emulated
NVML) with hand-made plans on one 7-slice GPU, so the slots are known:

- generation 0: ``a`` on 1g@0, ``b`` on 1g@1 and 1g@2; ``b`` takes one second per item, so a
  dozen requests keep generation 0 busy (and draining) for six;
- generation 1: ``b`` moves to one 3g.40gb at start 4 (free): generation 0 drains on 1g@1, 1g@2;
- the next plan adds a 2g.20gb of ``b``: its only free place is start 2, held by draining 1g@2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from factories import count_answers
from pinned import APP, instance, write_pinned

from jigsaw.backends.registry import backend_kind
from jigsaw.control.transition import MakeRoom, Need, transit
from jigsaw.node import load_node
from jigsaw.plan import Plan
from jigsaw.runtime.applied import Refuse
from jigsaw.runtime.frontend import Frontend
from jigsaw.runtime.generations import DesiredState, GenerationManager

PROFILES = """a-v,1g.10gb,1,1,1.0,1000.000,100,modeled,,,
b-v,1g.10gb,1,1,1000.0,1.000,100,modeled,,,
b-v,3g.40gb,1,1,20.0,50.000,100,modeled,,,
b-v,2g.20gb,1,1,40.0,25.000,100,modeled,,,
"""
REQUESTS = 12  # on generation 0: six seconds of b's work on its two processes


def _plans(tmp_path: Path, node_extra: str, added: str,
           slo_ms: float = 30000.0) -> tuple[Path, Plan, Plan, Plan]:
    placed = [{"profile": "1g.10gb", "start": 0, "task": "a", "variant": "a-v", "index": 0},
              *({"profile": "1g.10gb", "start": s, "task": "b", "variant": "b-v", "index": s - 1}
                for s in (1, 2))]
    args = write_pinned(tmp_path, latency_slo_ms=slo_ms, profiles=PROFILES, mps_levels="[1]",
                        node_extra=node_extra, demand_rps=1.0,
                        instances=[instance("a", "1g.10gb", 1, 1.0, 1000.0),
                                   instance("b", "1g.10gb", 2, 1000.0, 1.0)],
                        placed=placed, slices_used=3)
    node_path = Path(args[1])
    first = Plan.from_json_dict(json.loads(Path(args[3]).read_text()))
    a, b = first.instances
    big = dataclasses.replace(b, mig_profile="3g.40gb", count=1, slices=3, latency_ms=20.0,
                              throughput_rps=50.0)
    second = dataclasses.replace(first, instances=[a, big])
    two_g = dataclasses.replace(b, mig_profile="2g.20gb", count=1, slices=2, latency_ms=40.0,
                                throughput_rps=25.0)
    mid = two_g if added == "2g.20gb" else dataclasses.replace(b, count=1)
    third = dataclasses.replace(first, instances=[a, big, mid])
    if added == "2x2g.20gb":  # b moves to two 2g.20gb, at starts 2 and 4: over its only lane too
        third = dataclasses.replace(first, instances=[a, dataclasses.replace(two_g, count=2)], slices_used=5)
    return node_path, first, second, third


def _shm_segments(daemon_id: str) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if daemon_id in n}


Steps = Callable[[GenerationManager, Frontend, Callable[[], Any], dict[str, Any]], Awaitable[list[Any]]]


def _serve(node_path: Path, first: Plan, steps: Steps) -> dict[str, Any]:
    """Serve ``first`` (a real frontend, real workers, the emulated NVML), run ``steps(gm, fe,
    submit, out)`` (it returns the requests it sent), wait for every answer and for every old
    generation to retire; return what happened (``out``), the answers and what leaked."""
    node = load_node(node_path)
    logs: list[str] = []
    gm = GenerationManager(node, [(node.apps[0], first)], time_scale=1.0, seed=0,
                           backend=backend_kind("emulated"), log=logs.append)
    fe = Frontend(gm.backend, hop_latency_ms=0.0)
    daemon_id = gm.registry.daemon_id
    answers = count_answers(fe.dispatcher)  # request (object id) -> answers given
    out: dict[str, Any] = {"logs": logs}
    image = [("image", "UINT8", (4,), np.zeros(4, np.uint8))]

    def submit() -> Any:
        got = fe.dispatcher.submit(fe.routing.routes[APP], None, image, None)
        assert not isinstance(got, str), got
        return got
    try:
        gm.start_all(timeout_s=60)

        async def go() -> None:
            gm.attach(fe)
            fe.start(asyncio.get_running_loop())
            try:
                sent = await steps(gm, fe, submit, out)
                results = await asyncio.wait_for(asyncio.gather(*(r.future for r in sent)), 60)
                out["answered_at"] = asyncio.get_running_loop().time()
                out["statuses"] = Counter(status for status, _ in results)
                out["sent"] = len(sent)
                for _ in range(400):  # every old generation retires (a cut one at once)
                    if len(gm.generations) == 1 and not gm._retiring:  # (its segments unlinked too)
                        break
                    await asyncio.sleep(0.05)
                out["generations"] = sorted(gm.generations)
                await gm.stop_retiring()
            finally:
                fe.close()

        asyncio.run(go())
        out["answers"] = answers
        out["cut"] = (gm.drains_cut_total, dict(gm.cut_requests_total))
        out["waits"] = (gm.drain_waits_total, gm.drain_wait_s_total)
        out["mps_failures"] = gm.mps_daemons.failures_total
        out["metrics"] = gm.prometheus()
    finally:
        gm.close()
    out["leaked"] = _shm_segments(daemon_id)
    return out


def _run(tmp_path: Path, node_extra: str = "", added: str = "2g.20gb", slo_ms: float = 30000.0,
         requests: int = REQUESTS, need: Callable[[], Need] = Need, **desired: bool) -> dict[str, Any]:
    """Start generation 0, load it, re-plan to generation 1, then at once to the plan that adds
    an instance of ``b`` on ``added`` (a 2g.20gb needs generation 0's slot) as the controller
    moves an app (``transition.transit``: the node's making-room policy, reading ``need`` at each
    decision); return what happened (``third_step``: the step that ended that transition)."""
    node_path, first, second, third = _plans(tmp_path, node_extra, added, slo_ms)

    async def steps(gm: GenerationManager, fe: Frontend, submit: Callable[[], Any],
                    out: dict[str, Any]) -> list[Any]:
        sent = [submit() for _ in range(requests)]
        room = MakeRoom(gm.node.control.drain_wait_slo)
        one, _ = await transit(gm, DesiredState(APP, second), room)
        assert one.error is None and one.new_generation, (one, out["logs"])
        out["gen0_pending_before"] = fe.pending_in(one.previous)
        sent += [submit() for _ in range(4)]  # and a few on generation 1
        out["layout_before"] = gm.node_layout
        out["third_at"] = asyncio.get_running_loop().time()
        two, out["third_step"] = await transit(gm, DesiredState(APP, third, **desired), room, need)
        out["third_s"] = asyncio.get_running_loop().time() - out["third_at"]
        out["second"], out["third"] = one, two
        out["gen0_alive_after"] = one.previous in gm.generations
        out["layout"] = gm.node_layout
        return sent
    return _serve(node_path, first, steps)


def test_a_needed_replan_waits_for_the_drain_in_its_way_and_sends_nothing_again(tmp_path: Path) -> None:
    """The re-plan the app needs is not refused for the slot
    draining generation 0 holds; it waits until generation 0 has answered every request (its six
    seconds of work, within the 30 s SLO), then takes the slot. Nothing is sent twice: every
    request is answered 200, once, by the process it was queued on."""
    out = _run(tmp_path)
    two, logs = out["third"], out["logs"]
    assert out["gen0_pending_before"] > 0
    assert two.error is None and two.new_generation, (two, logs)
    assert any("waited" in line and "for their drains to end" in line for line in logs), logs
    assert not out["gen0_alive_after"]
    mid = [i for i in out["layout"].instances if i.profile == "2g.20gb"]
    assert [i.start for i in mid] == [2], out["layout"]
    cuts, settled = out["cut"]
    assert cuts == 1 and settled.get("resent", 0) == 0 and settled.get("failed", 0) == 0, settled
    assert out["waits"][0] == 1
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}, out["answers"]
    assert "jigsaw_reconfig_drain_waits_total 1" in out["metrics"]
    assert out["leaked"] == set()


def test_an_extension_over_draining_slots_is_placed_beside_what_serves_and_waits_for_the_drain(
        tmp_path: Path) -> None:
    """``DesiredState.over_draining``: the plan placed beside
    what serves only takes start 2, which draining generation 0 holds, and waits for that drain;
    placed beside everything (``over_draining`` false) it does not fit and is placed as any plan."""
    out = _run(tmp_path / "over", beside=True, over_draining=True)
    two, logs = out["third"], out["logs"]
    assert two.error is None and two.new_generation, (two, logs)
    assert not any("no longer fits beside" in line for line in logs), logs
    assert any("for their drains to end" in line for line in logs), logs
    assert [i.start for i in out["layout"].instances if i.profile == "2g.20gb"] == [2], out["layout"]
    assert out["cut"][1].get("resent", 0) == 0
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert out["leaked"] == set()
    plain = _run(tmp_path / "plain", beside=True)
    assert any("no longer fits beside" in line for line in plain["logs"]), plain["logs"]


def _kept_after_a_second(out: dict[str, Any], note: str, logged: str, outcome: str) -> None:
    """The re-plan's wait for generation 0's drain ended after about a second (``note`` in its
    answer, ``logged`` in the log, counted as ``outcome``): nothing changed, the MIG instances it
    brought up are gone, generation 0 drains on, every request answered 200 once."""
    two, logs = out["third"], out["logs"]
    assert not two.new_generation and two.error is None, (two, logs)
    assert note in (two.note or ""), two
    assert any(logged in line for line in logs), logs
    assert 0.9 < out["third_s"] < 4.5, out["third_s"]  # not the six seconds of generation 0
    assert out["gen0_alive_after"] and out["cut"][0] == 0  # it drains on, nothing re-sent
    assert out["layout"] == out["layout_before"]
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}, out["answers"]
    assert f'jigsaw_reconfig_drain_first_total{{outcome="{outcome}"}} 1' in out["metrics"]
    assert out["leaked"] == set()


def test_a_needed_replan_stops_waiting_for_the_drain_once_the_rate_no_longer_needs_it(tmp_path: Path) -> None:
    """The re-plan waiting for generation 0's six seconds of work is decided again at each poll,
    on whether the rate still needs it (``Need.still_needed``); once it does not (here after about
    a second: the spike it was for has passed) the wait ends, nothing is cut or sent again and the
    running generation serves on."""
    t0: list[float] = []

    def passes_after_a_second() -> Need:
        t0.append(t0[0] if t0 else asyncio.get_running_loop().time())
        return Need(still_needed=asyncio.get_running_loop().time() - t0[0] < 1.0)
    _kept_after_a_second(_run(tmp_path, need=passes_after_a_second),
                         "the rate now arriving is one the running plan holds",
                         "no longer needed: the wait ends there", "not_needed")


def test_a_needed_replan_stops_waiting_for_the_drain_once_the_arrivals_outgrow_it(tmp_path: Path) -> None:
    """The re-plan waiting for generation 0's six seconds of work is decided again at each poll, on
    whether the arrivals have outgrown it (``Need.outgrown``); once they have (after about a
    second) the wait ends and nothing changes (no drain cut, nothing sent again, the MIG instances
    it brought up released), so the node's re-plan lock is free for a plan sized to the rate."""
    t0: list[float] = []

    def grows_after_a_second() -> Need:
        t0.append(t0[0] if t0 else asyncio.get_running_loop().time())
        return Need(outgrown=asyncio.get_running_loop().time() - t0[0] >= 1.0)
    _kept_after_a_second(_run(tmp_path, need=grows_after_a_second),
                         "the arrivals outgrew the new plan",
                         "the arrivals outgrew the plan: the wait ends there", "outgrown")


def test_the_wait_for_a_drain_that_cannot_answer_in_time_sends_nothing_again(tmp_path: Path) -> None:
    """24 requests hold twelve seconds of ``b``'s work on generation 0's two processes against an
    8 s SLO, so the last ones in its rings cannot make it: the workers drop them 504 (the early
    drop at pop) once the ones ahead are done, and the re-plan's wait ends there, within the
    drain's own deadline. Nothing is sent again; every request is answered once (200 or 504)."""
    out = _run(tmp_path, slo_ms=8000.0, requests=24)
    two, logs = out["third"], out["logs"]
    assert two.error is None and two.new_generation, (two, logs)
    assert not out["gen0_alive_after"]
    cuts, settled = out["cut"]
    assert cuts == 1 and settled.get("resent", 0) == 0, settled
    statuses = out["statuses"]
    assert set(statuses) == {200, 504} and statuses[200] >= 4 + 2, statuses  # generation 1's 4 + some
    assert sum(statuses.values()) == out["sent"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}, out["answers"]
    assert out["waits"][0] == 1
    assert not any("unsettled after drain" in line for line in logs), logs
    assert out["leaked"] == set()


def test_a_needed_replan_that_would_leave_no_lane_is_refused_before_waiting(tmp_path: Path) -> None:
    """b moves to two 2g.20gb instances, at start 2 (held by draining generation 0) and start 4
    (generation 1's 3g.40gb, b's only instance). Whatever the drain does, the drain-first after it
    would leave b no lane: the re-plan is refused at once, without the wait, generation 0 still
    draining. Every request is answered once."""
    out = _run(tmp_path, added="2x2g.20gb")
    two, logs = out["third"], out["logs"]
    assert not two.new_generation and isinstance(out["third_step"], Refuse), (two, logs)
    assert "no lane left" in (two.error or "") and "refused before waiting" in (two.error or ""), two
    assert not any("for their drains to end" in line for line in logs) and out["waits"][0] == 0, logs
    assert out["gen0_alive_after"]
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}
    assert out["leaked"] == set()
