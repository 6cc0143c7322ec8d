"""Paper §3.3 drop rules and OIP request parameters, on real workers with controlled emulated latencies."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from dpserver import http, image, write_tiny


async def _burst(url: str, bodies: list[dict], timeout_s: float = 60.0) -> list[tuple[int, dict]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(bodies))) as session:
        async def one(body: dict) -> tuple[int, dict]:
            async with session.post(url, json=body) as r:
                return r.status, await r.json()
        return await asyncio.wait_for(asyncio.gather(*(one(b) for b in bodies)), timeout_s)


def test_items_waiting_in_the_ring_go_stale(server_factory, tmp_path):
    # One process, batches of one taking 40 ms, staleness 5 ms, a generous SLO: of a burst, the
    # first item runs at once; the rest wait in the ring far longer than 5 ms. Their age counts
    # from ring entry, so they are dropped as stale when popped (not served 40 ms apart).
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 40.0}, 1)], latency_slo_ms=20000.0,
                      staleness_ms=5.0, server={"stale_drops": "true"})
    s = server_factory(args)
    url = s.url + "/v2/models/tiny/infer"
    assert http("POST", url, image())[0] == 200  # alone: never stale
    results = asyncio.run(_burst(url, [image() for _ in range(20)]))
    statuses = [st for st, _ in results]
    assert len(results) == 20 and set(statuses) <= {200, 504}, statuses
    assert statuses.count(200) >= 1, statuses
    stale = [doc for st, doc in results if st == 504]
    assert len(stale) >= 5, statuses  # stamped at pop instead, none would ever be stale
    for doc in stale:
        assert doc["reason"] == "stale" and doc["task"] == "a", doc
    _, text, _ = http("GET", s.url + "/metrics")
    assert 'reason="stale"' in text


def test_stale_drops_off_or_a_large_staleness_serve_the_same_burst(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 10.0}, 1)], latency_slo_ms=20000.0,
                      staleness_ms=10000.0, server={"stale_drops": "true"})
    s = server_factory(args)
    results = asyncio.run(_burst(s.url + "/v2/models/tiny/infer", [image() for _ in range(12)]))
    assert [st for st, _ in results] == [200] * 12
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 10.0}, 1)], latency_slo_ms=20000.0,
                      staleness_ms=1.0, name="off")  # stale_drops defaults to off
    s = server_factory(args, name="off")
    results = asyncio.run(_burst(s.url + "/v2/models/off/infer", [image() for _ in range(12)]))
    assert [st for st, _ in results] == [200] * 12


def test_timeout_parameter_tightens_the_deadline(server_factory, tmp_path):
    # a then b, 100 ms each: 200 ms of work. The SLO (5 s) would allow it; a 50 ms timeout cannot
    # be met even by the fastest path, so the frontend drops it at push, before any worker runs it.
    # a makes 3 items for b: the drop counts as 3 violations in the paper's way (items_lost).
    args = write_tiny(tmp_path, tasks=[("a", "detector", {1: 100.0}, 1), ("b", "classifier", {1: 100.0}, 4)],
                      edges=[("a", "b", 3.0)], latency_slo_ms=5000.0)
    s = server_factory(args)
    url = s.url + "/v2/models/tiny/infer"
    assert http("POST", url, image())[0] == 200
    body = {**image(), "parameters": {"timeout": 50_000}}
    t0 = time.monotonic()
    status, doc, _ = http("POST", url, body)
    assert status == 504 and doc["status"] == "DROPPED_DEADLINE" and doc["task"] == "a", doc
    assert doc["items_lost"] == 3.0, doc
    assert time.monotonic() - t0 < 0.09  # answered before a's 100 ms batch could have ended
    # A timeout the path can meet: served.
    status, doc, _ = http("POST", url, {**image(), "parameters": {"timeout": 3_000_000}})
    assert status == 200, doc
    for bad in (0, -5, 1.5, "10", True, None):
        status, doc, _ = http("POST", url, {**image(), "parameters": {"timeout": bad}})
        assert status == 400 and "parameters.timeout" in doc["error"], (bad, doc)


def test_priority_parameter_is_refused_not_ignored(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1)])
    s = server_factory(args)
    url = s.url + "/v2/models/tiny/infer"
    assert http("POST", url, {**image(), "parameters": {"priority": 0}})[0] == 200
    for p in (1, 7, "high", True):
        status, doc, _ = http("POST", url, {**image(), "parameters": {"priority": p}})
        assert status == 400, (p, doc)
        assert "parameters.priority" in doc["error"] and "not supported" in doc["error"], doc
