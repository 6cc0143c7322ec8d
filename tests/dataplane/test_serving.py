"""Requests crossing real worker processes: chains, fan-out, deadline drops, bursts, shedding."""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import pytest
from dpserver import EXAMPLE_NODE, Server, http, image, write_tiny


async def _post_many(url: str, bodies: list[dict], *, delay_s: float = 0.0, limit: int = 100,
                     timeout_s: float = 60.0) -> list[tuple[int, dict]]:
    conn = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def one(i: int, body: dict) -> tuple[int, dict]:
            await asyncio.sleep(i * delay_s)
            async with session.post(url, json=body) as r:
                return r.status, await r.json()
        return await asyncio.wait_for(asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))), timeout_s)


def test_chain_and_fanout_on_the_example_node(server_factory):
    s = server_factory(["--node-config", str(EXAMPLE_NODE), "--apps", "ar_assistant,traffic_analysis",
                        "--demand", "10", "--plan-time-limit", "3"])
    for i in range(3):
        status, out, _ = http("POST", s.url + "/v2/models/ar_assistant/infer", image(16, rid=f"ar{i}"))
        assert status == 200, out
        p = out["parameters"]
        assert [p[f"items.{t}"] for t in ("detect", "caption", "speak")] == [1, 1, 1]
        assert p["children.detect"] == 1 and p["children.caption"] == 1
        outs = {o["name"]: o for o in out["outputs"]}  # the real TTS outputs: waveform and its length
        assert outs["speak.audio"]["shape"] == [1, outs["speak.audio_samples"]["data"][0]]
        # the chain took at least the emulated latencies of its three tasks
        assert p["e2e_us"] >= sum(p[f"compute_us.{t}"] for t in ("detect", "caption", "speak"))
    total_children = 0
    for _ in range(6):
        status, out, _ = http("POST", s.url + "/v2/models/traffic_analysis/infer", image(16))
        assert status == 200, out
        p = out["parameters"]
        outs = {o["name"]: o for o in out["outputs"]}
        n_car, n_person = outs["car.label"]["shape"][0], outs["person.label"]["shape"][0]
        assert n_car == p.get("items.car", 0) and n_person == p.get("items.person", 0)
        assert n_car + n_person == p.get("children.detect", 0)
        assert len(outs["car.score"]["data"]) == n_car
        total_children += n_car + n_person
    assert total_children > 6 * 5  # yolov5 variants draw ~2.6..19 objects per frame


def test_parallel_roots_join_into_one_answer(server_factory):
    # social_media sends every image to two root tasks; the answer waits for both branches.
    s = server_factory(["--node-config", str(EXAMPLE_NODE), "--apps", "social_media",
                        "--demand", "10", "--plan-time-limit", "3"])
    for i in range(4):
        status, out, _ = http("POST", s.url + "/v2/models/social_media/infer", image(8, rid=f"s{i}"))
        assert status == 200, out
        tasks = {o["name"].split(".")[0] for o in out["outputs"]}
        assert tasks == {"classify", "caption"}, out["outputs"]
        p = out["parameters"]
        assert p["items.classify"] == 1 and p["items.caption"] == 1
        assert p["e2e_us"] >= max(p["compute_us.classify"], p["compute_us.caption"])


def test_deadline_drops_when_and_only_when_they_must(server_factory, tmp_path):
    # a: 200 ms alone, 280 ms for a batch of two; b: 200 ms. A request alone needs 400 ms.
    slo_ms = 610.0
    args = write_tiny(tmp_path, tasks=[("a", "generic", {1: 200.0, 2: 280.0}, 2),
                                       ("b", "classifier", {1: 200.0}, 1)],
                      edges=[("a", "b", 1.0)], latency_slo_ms=slo_ms)
    s = server_factory(args)
    url = s.url + "/v2/models/tiny/infer"
    # Alone: 400 ms of work within 610 ms, never dropped.
    for _ in range(2):
        assert http("POST", url, image())[0] == 200
    # Two requests sent 30 ms after a blocker wait for it at a (until 200 ms), still feasible there
    # (200 + 200 + 200 <= 30 + 610) and run together (280 ms); at b, 480 + 200 > 640: dropped by b.
    t0 = time.monotonic()
    results = asyncio.run(_post_many(url, [image(), image(), image()], delay_s=0.0))  # warm connections
    assert [r[0] for r in results].count(200) >= 1
    time.sleep(1.0)
    t0 = time.monotonic()
    results = asyncio.run(_post_many_staggered(url))
    elapsed = time.monotonic() - t0
    blocker, r1, r2 = results
    assert blocker[0] == 200, blocker
    for status, doc in (r1, r2):
        assert status == 504, doc
        assert doc["task"] == "b" and doc["status"] == "DROPPED_DEADLINE" and doc["reason"] == "deadline"
    assert elapsed < 1.5
    # An SLO the first task alone cannot meet: dropped at once by a, before it runs.
    args = write_tiny(tmp_path, tasks=[("a", "generic", {1: 200.0}, 1), ("b", "classifier", {1: 200.0}, 1)],
                      edges=[("a", "b", 1.0)], latency_slo_ms=300.0, name="tight")
    s2 = server_factory(args, name="tight")
    t0 = time.monotonic()
    status, doc, _ = http("POST", s2.url + "/v2/models/tight/infer", image())
    assert status == 504 and doc["task"] == "a" and doc["status"] == "DROPPED_DEADLINE"
    assert time.monotonic() - t0 < 0.15
    _, text, _ = http("GET", s2.url + "/metrics")
    assert 'jigsaw_inference_request_dropped_total{app="tight",reason="deadline",task="a"} 1' in text \
        or 'jigsaw_inference_request_dropped_total{app="tight",task="a",reason="deadline"} 1' in text


async def _post_many_staggered(url: str) -> list[tuple[int, dict]]:
    async with aiohttp.ClientSession() as session:
        async def one(delay_s: float) -> tuple[int, dict]:
            await asyncio.sleep(delay_s)
            async with session.post(url, json=image()) as r:
                return r.status, await r.json()
        return await asyncio.wait_for(asyncio.gather(one(0.0), one(0.03), one(0.03)), 30)


def test_burst_loses_nothing(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "detector", {1: 1.0, 4: 2.0}, 4),
                                       ("b", "classifier", {1: 0.5, 4: 1.0}, 4)],
                      edges=[("a", "b", 3.0)], latency_slo_ms=5000.0)
    s = server_factory(args)
    n = 400
    t0 = time.monotonic()
    results = asyncio.run(_post_many(s.url + "/v2/models/tiny/infer", [image(8) for _ in range(n)]))
    assert len(results) == n  # every request answered exactly once
    assert all(status == 200 for status, _ in results), {st for st, _ in results}
    for _, out in results:
        p = out["parameters"]
        assert out["outputs"][0]["shape"][0] == p.get("children.a", 0)
    assert time.monotonic() - t0 < 60
    _, text, _ = http("GET", s.url + "/metrics")
    assert f'jigsaw_inference_request_success_total{{app="tiny"}} {n}' in text
    assert 'jigsaw_inference_pending_requests{app="tiny"} 0' in text


def test_admission_control_sheds_with_503(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 300.0}, 1)], latency_slo_ms=5000.0,
                      max_queue=2)
    s = server_factory(args)
    results = asyncio.run(_post_many(s.url + "/v2/models/tiny/infer", [image() for _ in range(6)]))
    statuses = sorted(st for st, _ in results)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, statuses
    assert all(st in (200, 503) for st in statuses)
    assert any("max_queue" in doc["error"] for st, doc in results if st == 503)


@pytest.mark.parametrize("kind", ["fifo", "eventfd"])
def test_both_doorbell_kinds_serve_a_chain(tmp_path, kind):
    """``JIGSAW_DOORBELL``: the FIFO doorbells (where other processes may not take the daemon's
    eventfds) and the eventfd ones serve the same answers; only the FIFO kind leaves FIFOs."""
    from jigsaw.runtime import rings

    if kind == "eventfd" and not rings._probe_eventfd_sharing():
        pytest.skip("this machine does not let a child take its parent's descriptors (pidfd_getfd)")
    args = write_tiny(tmp_path, tasks=[("a", "generic", {1: 1.0}, 1), ("b", "generic", {1: 1.0}, 1),
                                       ("c", "classifier", {1: 1.0}, 1)],
                      edges=[("a", "b", 1.0), ("b", "c", 1.0)], latency_slo_ms=2000.0, name="bells")
    with Server(args, tmp_path / "bells.log", env={"JIGSAW_DOORBELL": kind}) as s:
        for i in range(5):
            status, doc, _ = http("POST", s.url + "/v2/models/bells/infer", image(rid=f"r{i}"))
            assert status == 200, doc
            # (the real backends' classifier outputs: a box only when fed by a detector, else none)
            assert doc["id"] == f"r{i}"
            assert [o["name"] for o in doc["outputs"]] == ["c.label", "c.score", "c.box"]
            assert [doc["parameters"][f"items.{t}"] for t in "abc"] == [1, 1, 1]
        assert s.proc is not None
        fifos = [e for e in os.listdir(rings.SHM_DIR)
                 if e.startswith(f"jigsaw-{s.proc.pid}-") and e.endswith(rings.FIFO_SUFFIX)]
        assert bool(fifos) == (kind == "fifo"), fifos
