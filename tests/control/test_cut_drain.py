"""A re-plan whose new MIG instance needs a slot a draining generation still holds cuts that drain
short: the draining generation's requests are settled at once (re-sent on the serving generation),
its processes stop, its slots are freed and the re-plan takes them; every request is answered once.

The generation manager is driven directly (a real frontend, real worker processes, the emulated
NVML) with hand-made plans on one 7-slice GPU, so the slots are known:

- generation 0: ``a`` on 1g@0, ``b`` on 1g@1 and 1g@2; ``b`` takes one second per item, so a
  dozen requests keep generation 0 busy (and draining) for six;
- generation 1: ``b`` moves to one 3g.40gb at start 4 (free): generation 0 drains on 1g@1, 1g@2;
- the next plan adds a 2g.20gb of ``b``: its only free place is start 2, held by draining 1g@2.

Only a drain with few requests left to answer is cut (``control.cut_drain_max_unanswered``):
re-sending a busy one's put a burst on the new plan.
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
from jigsaw.node import load_node
from jigsaw.plan import Plan
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


# the drain switches these tests are about (off by default): on unless a test sets them
DRAIN_SWITCHES = {"cut_drains": "true", "place_around_busy_drains": "true", "drain_late_credits": "false",
                  "cut_drains_when_needed": "false", "wait_drains_when_needed": "false"}


def _with_switches(node_extra: str) -> str:
    body = node_extra.removeprefix("[control]\n")
    on = "".join(f"{k} = {v}\n" for k, v in DRAIN_SWITCHES.items() if f"{k} =" not in body)
    return "[control]\n" + on + body


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
        out["mps_failures"] = gm.mps_failures_total
        out["metrics"] = gm.prometheus()
    finally:
        gm.close()
    out["leaked"] = _shm_segments(daemon_id)
    return out


def _run(tmp_path: Path, node_extra: str = "", added: str = "2g.20gb", slo_ms: float = 30000.0,
         requests: int = REQUESTS, still_needed: Callable[[], bool] | None = None,
         outgrown: Callable[[], bool] | None = None, **desired: bool) -> dict[str, Any]:
    """Start generation 0, load it, re-plan to generation 1, then at once to the plan that adds
    an instance of ``b`` on ``added`` (a 2g.20gb needs generation 0's slot); return what happened.
    The drain switches are on unless ``node_extra`` sets them."""
    node_path, first, second, third = _plans(tmp_path, _with_switches(node_extra), added, slo_ms)

    async def steps(gm: GenerationManager, fe: Frontend, submit: Callable[[], Any],
                    out: dict[str, Any]) -> list[Any]:
        sent = [submit() for _ in range(requests)]
        one = await gm.apply(DesiredState(APP, second))
        assert one.error is None and one.new_generation, (one, out["logs"])
        out["gen0_pending_before"] = fe.pending_in(one.previous)
        out["keep_off"] = sorted((i.gpu, i.start) for i in gm._keep_off())
        sent += [submit() for _ in range(4)]  # and a few on generation 1
        out["layout_before"] = gm.node_layout
        out["third_at"] = asyncio.get_running_loop().time()
        two = await gm.apply(DesiredState(APP, third, still_needed=still_needed, outgrown=outgrown,
                                          **desired))
        out["third_s"] = asyncio.get_running_loop().time() - out["third_at"]
        out["second"], out["third"] = one, two
        out["gen0_alive_after"] = one.previous in gm.generations
        out["layout"] = gm.node_layout
        return sent
    return _serve(node_path, first, steps)


def test_a_replan_cuts_the_drain_in_its_way_short_and_every_request_is_answered_once(tmp_path: Path) -> None:
    out = _run(tmp_path, f"[control]\ncut_drain_max_unanswered = {REQUESTS}\n")
    logs = out["logs"]
    assert out["gen0_pending_before"] > 0  # generation 0 was draining, its requests queued in b
    two = out["third"]
    assert two.error is None and two.new_generation, (two, logs)
    assert any("drains cut short" in line for line in logs), logs
    assert not out["gen0_alive_after"]  # retired by the time the re-plan returned, not 6 s later
    mid = [i for i in out["layout"].instances if i.profile == "2g.20gb"]
    assert [i.start for i in mid] == [2], out["layout"]  # on the slot generation 0 held
    cuts, settled = out["cut"]
    assert cuts == 1 and settled.get("resent", 0) >= 1, settled
    assert "jigsaw_reconfig_drains_cut_total 1" in out["metrics"]
    # every accepted request answered exactly once, and the re-sent ones in time (200)
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}, out["answers"]
    assert out["generations"] == [two.generation]
    assert out["mps_failures"] == 0 and not any("did not stop" in line for line in logs), logs
    assert not any("unsettled after drain" in line for line in logs), logs
    assert out["leaked"] == set()


def test_without_cutting_the_replan_is_refused_while_the_drain_holds_the_slot(tmp_path: Path) -> None:
    out = _run(tmp_path, "[control]\ncut_drains = false\n")
    two = out["third"]
    assert not two.new_generation and two.error is not None and "drain-first refused" in two.error, two
    assert out["gen0_alive_after"]  # still draining its queued requests
    assert out["cut"][0] == 0
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert out["leaked"] == set()


def test_a_drain_with_more_requests_to_answer_than_the_limit_is_not_cut(tmp_path: Path) -> None:
    out = _run(tmp_path, f"[control]\ncut_drain_max_unanswered = {REQUESTS // 4}\n")
    two = out["third"]
    assert not two.new_generation and "drain-first refused" in (two.error or ""), two
    assert any("not cut short" in line for line in out["logs"]), out["logs"]
    assert out["gen0_alive_after"] and out["cut"][0] == 0
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert out["leaked"] == set()


def test_a_busy_drain_is_placed_around_where_the_node_has_room(tmp_path: Path) -> None:
    """The slots of a drain too busy to cut are kept off when a new plan is placed (a 1g.10gb of
    ``b`` then goes to start 3, free), so the re-plan is not refused for them."""
    limit = f"[control]\ncut_drain_max_unanswered = {REQUESTS // 4}\n"
    out = _run(tmp_path, limit, added="1g.10gb")
    assert out["keep_off"] == [(0, 0), (0, 1), (0, 2)]  # generation 0's (a@0 is kept by 1 too)
    two = out["third"]
    assert two.error is None and two.new_generation, (two, out["logs"])
    assert out["gen0_alive_after"] and out["cut"][0] == 0  # not cut: it drains on
    small = sorted(i.start for i in out["layout"].instances if i.profile == "1g.10gb" and i.start > 0)
    assert small == [3], out["layout"]
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    off = _run(tmp_path / "off", limit + "place_around_busy_drains = false\n", added="1g.10gb")
    assert off["keep_off"] == []
    cuttable = _run(tmp_path / "cuttable", f"[control]\ncut_drain_max_unanswered = {REQUESTS}\n",
                    added="1g.10gb")
    assert cuttable["keep_off"] == []  # a drain that can be cut holds nothing a plan must keep off


def test_a_needed_replan_waits_a_share_of_the_slo_for_the_drain_then_cuts_it(tmp_path: Path) -> None:
    """With the cut switches off, a re-plan the app needs (the default ``running_holds=False``:
    its running plan does not hold the demand) waits ``drain_first_wait_slo`` of the SLO for the
    drain in its way (0.1 s of 30 s here, far less than its 6 s of work), then cuts it whatever it
    holds: the re-plan is made, the rest re-sent, every request answered once."""
    out = _run(tmp_path, "[control]\ncut_drains = false\nplace_around_busy_drains = false\n"
                         "cut_drains_when_needed = true\ndrain_first_wait_slo = 0.0034\n")
    two, logs = out["third"], out["logs"]
    assert two.error is None and two.new_generation, (two, logs)
    assert any("drains cut short" in line for line in logs), logs
    assert not out["gen0_alive_after"]
    cuts, settled = out["cut"]
    assert cuts == 1 and settled.get("resent", 0) > REQUESTS // 4, settled  # more than the limit's 8
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}, out["answers"]
    assert out["leaked"] == set()


# the cut switches off: only the wait (and the hopeless rule) act
WAIT = "[control]\ncut_drains = false\nplace_around_busy_drains = false\nwait_drains_when_needed = true\n"


def test_a_needed_replan_waits_for_the_drain_in_its_way_and_sends_nothing_again(tmp_path: Path) -> None:
    """``control.wait_drains_when_needed``: the re-plan the app needs is not refused for the slot
    draining generation 0 holds; it waits until generation 0 has answered every request (its six
    seconds of work, within the 30 s SLO), then takes the slot. Nothing is sent twice: every
    request is answered 200, once, by the process it was queued on."""
    out = _run(tmp_path, WAIT)
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
    """``DesiredState.over_draining`` (``control.extend_over_draining``): the plan placed beside
    what serves only takes start 2, which draining generation 0 holds, and waits for that drain;
    placed beside everything (``over_draining`` false) it does not fit and is placed as any plan."""
    out = _run(tmp_path / "over", WAIT, beside=True, over_draining=True)
    two, logs = out["third"], out["logs"]
    assert two.error is None and two.new_generation, (two, logs)
    assert not any("no longer fits beside" in line for line in logs), logs
    assert any("for their drains to end" in line for line in logs), logs
    assert [i.start for i in out["layout"].instances if i.profile == "2g.20gb"] == [2], out["layout"]
    assert out["cut"][1].get("resent", 0) == 0
    assert out["statuses"] == {200: out["sent"]}, out["statuses"]
    assert out["leaked"] == set()
    plain = _run(tmp_path / "plain", WAIT, beside=True)
    assert any("no longer fits beside" in line for line in plain["logs"]), plain["logs"]


def _kept_after_a_second(out: dict[str, Any], note: str, logged: str, outcome: str) -> None:
    """The re-plan's wait for generation 0's drain ended after about a second (``note`` in its
    answer, ``logged`` in the log, counted as ``outcome``): nothing changed, the MIG instances it
    brought up are gone, generation 0 drains on, every request answered 200 once."""
    two, logs = out["third"], out["logs"]
    assert not two.new_generation and two.error is None and not two.refused, (two, logs)
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
    """``control.recheck_need_before_drain_first``: the re-plan waiting for generation 0's six
    seconds of work asks at each poll whether it is still needed; once told no (here after about a
    second: the spike it was for has passed) it stops waiting, cuts nothing, sends nothing again
    and keeps the running generation. Off, it waits the whole drain and takes the slot."""
    t0: list[float] = []

    def passes_after_a_second() -> bool:
        t0.append(t0[0] if t0 else asyncio.get_running_loop().time())
        return asyncio.get_running_loop().time() - t0[0] < 1.0
    _kept_after_a_second(_run(tmp_path / "on", WAIT, still_needed=passes_after_a_second),
                         "the rate now arriving is one the running plan holds",
                         "no longer needed: the wait ends there", "not_needed")
    t0.clear()
    off = _run(tmp_path / "off", WAIT + "recheck_need_before_drain_first = false\n",
               still_needed=passes_after_a_second)
    assert off["third"].new_generation and not off["gen0_alive_after"], (off["third"], off["logs"])
    assert off["third_s"] > 3.0, off["third_s"]


def test_a_needed_replan_stops_waiting_for_the_drain_once_the_arrivals_outgrow_it(tmp_path: Path) -> None:
    """``control.end_wait_outgrown_above``: the re-plan waiting for generation 0's six seconds of
    work asks at each poll whether the arrivals have outgrown it; told yes after about a second,
    it stops waiting, changes nothing (no drain cut, nothing sent again, the MIG instances it
    brought up released) and returns, so the node's re-plan lock is free for a plan sized to the
    rate. Off (0), the callback is not asked: it waits the whole drain and takes the slot."""
    t0: list[float] = []
    asked: list[int] = []

    def grows_after_a_second() -> bool:
        asked.append(1)
        t0.append(t0[0] if t0 else asyncio.get_running_loop().time())
        return asyncio.get_running_loop().time() - t0[0] >= 1.0
    _kept_after_a_second(_run(tmp_path / "on", WAIT, outgrown=grows_after_a_second),
                         "the arrivals outgrew the new plan",
                         "the arrivals outgrew the plan: the wait ends there", "outgrown")
    t0.clear()
    asked.clear()
    off = _run(tmp_path / "off", WAIT + "end_wait_outgrown_above = 0\n", outgrown=grows_after_a_second)
    assert off["third"].new_generation and not off["gen0_alive_after"], (off["third"], off["logs"])
    assert off["third_s"] > 3.0 and not asked, off["third_s"]


def test_the_wait_for_a_drain_that_cannot_answer_in_time_sends_nothing_again(tmp_path: Path) -> None:
    """24 requests hold twelve seconds of ``b``'s work on generation 0's two processes against an
    8 s SLO, so the last ones in its rings cannot make it: the workers drop them 504 (the early
    drop at pop) once the ones ahead are done, and the re-plan's wait ends there, within the
    drain's own deadline. Nothing is sent again; every request is answered once (200 or 504)."""
    out = _run(tmp_path, WAIT, slo_ms=8000.0, requests=24)
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
    """``control.refuse_before_drain_wait``: b moves to two 2g.20gb instances, at start 2 (held by
    draining generation 0) and start 4 (generation 1's 3g.40gb, b's only instance). Whatever the
    drain does, the drain-first after it would leave b no lane: the re-plan is refused at once,
    without the wait. Off, it waits for generation 0's drain (six seconds of b's work) and is
    refused after it. Every request is answered once either way."""
    for on in (True, False):
        out = _run(tmp_path / str(on), WAIT + f"refuse_before_drain_wait = {str(on).lower()}\n",
                   added="2x2g.20gb")
        two, logs = out["third"], out["logs"]
        assert not two.new_generation and two.refused, (two, logs)
        assert "no lane left" in (two.error or ""), two
        waited = any("for their drains to end" in line for line in logs)
        assert waited != on and out["waits"][0] == (0 if on else 1), logs
        assert ("refused before waiting" in (two.error or "")) == on, two
        assert out["gen0_alive_after"] == on  # refused at once, generation 0 still draining
        assert out["statuses"] == {200: out["sent"]}, out["statuses"]
        assert len(out["answers"]) == out["sent"] and set(out["answers"].values()) == {1}
        assert out["leaked"] == set()
    assert load_node(Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"
                     ).control.refuse_before_drain_wait  # on by default


def _switch_once(tmp_path: Path, handover: bool) -> dict[str, Any]:
    """Load generation 0 (``b`` at one second per item on two processes: six seconds of work),
    switch to generation 1 (``b`` on a 3g.40gb at 20 ms per item) as a plan the app needs, and time
    until every request is answered (``answered_s``)."""
    node_path, first, second, _ = _plans(tmp_path, _with_switches(
        f"[control]\nhandover_on_needed_switch = {str(handover).lower()}\n"), "2g.20gb")

    async def steps(gm: GenerationManager, fe: Frontend, submit: Callable[[], Any],
                    out: dict[str, Any]) -> list[Any]:
        sent = [submit() for _ in range(REQUESTS)]
        await asyncio.sleep(0.3)  # generation 0's two processes start their first items
        one = await gm.apply(DesiredState(APP, second, running_holds=False))
        assert one.error is None and one.new_generation, (one, out["logs"])
        out["switched_at"] = asyncio.get_running_loop().time()
        return sent
    out = _serve(node_path, first, steps)
    out["answered_s"] = out["answered_at"] - out["switched_at"]
    return out


def test_a_needed_switch_hands_its_predecessors_queue_to_the_new_generation(tmp_path: Path) -> None:
    """``control.handover_on_needed_switch``: the twelve requests queued on generation 0's two
    slow processes are sent again on generation 1 once it serves, answered within a second or two
    instead of the six seconds generation 0 needs; each is answered once, 200, and generation 0
    retires without draining. Off (the default), generation 0 answers them itself."""
    on = _switch_once(tmp_path / "on", True)
    assert any("handed over to generation" in line for line in on["logs"]), on["logs"]
    assert on["statuses"] == {200: REQUESTS}, on["statuses"]
    assert len(on["answers"]) == REQUESTS and set(on["answers"].values()) == {1}, on["answers"]
    assert on["answered_s"] < 3.0, on["answered_s"]
    assert "jigsaw_reconfig_handovers_total 1" in on["metrics"]
    assert len(on["generations"]) == 1 and on["leaked"] == set()
    off = _switch_once(tmp_path / "off", False)
    assert not any("handed over" in line for line in off["logs"])
    assert off["statuses"] == {200: REQUESTS}, off["statuses"]
    assert off["answered_s"] > 4.0, off["answered_s"]  # generation 0's own six seconds, less the head start
    assert "jigsaw_reconfig_handovers_total 0" in off["metrics"]
    assert not load_node(Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml"
                         ).control.handover_on_needed_switch  # off by default
