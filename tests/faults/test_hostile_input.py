"""Hostile input against a real jigsawd: every bad request gets a clear 4xx, nothing dies or leaks.

One daemon serves the whole module; the invariant checked after every scenario is that the
node is still ready, its workers are the same processes, and valid requests are all answered.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
from dpserver import Server, http, image, worker_pids, write_tiny

from jigsaw.testing import shm_entries

MAX_PAYLOAD = 8192


@pytest.fixture(scope="module")
def node(http_front: str, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("hostile")
    args = write_tiny(tmp, tasks=[("a", "classifier", {1: 1.0, 2: 1.5}, 2),
                                  ("b", "classifier", {1: 1.0, 2: 1.5}, 2)],
                      edges=[("a", "b", 1.0)], max_payload_bytes=MAX_PAYLOAD, latency_slo_ms=2000.0)
    with Server(args, tmp / "jigsawd.log") as server:
        server.worker_pids = worker_pids(server.proc.pid)
        yield server
    assert shm_entries(server.proc.pid) == []


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def assert_healthy(server: Server, n: int = 20) -> None:
    assert http("GET", server.url + "/v2/health/ready")[0] == 200
    assert worker_pids(server.proc.pid) == server.worker_pids, "a worker died or was replaced"
    for i in range(n):
        status, body, _ = http("POST", server.url + "/v2/models/tiny/infer", image(4, rid=f"ok-{i}"))
        assert status == 200, body


def post_raw(server: Server, raw: bytes, path: str = "/v2/models/tiny/infer") -> tuple[int, object]:
    status, body, _ = http("POST", server.url + path, raw=raw)
    return status, body


BAD_BODIES = {
    "not json": b"{nope",
    "empty": b"",
    "a list": b"[1, 2, 3]",
    "no inputs": b'{"id": "x"}',
    "inputs not a list": b'{"inputs": 5}',
    "unknown input": b'{"inputs": [{"name": "zz", "datatype": "UINT8", "shape": [1], "data": [1]}]}',
    "wrong datatype": b'{"inputs": [{"name": "image", "datatype": "FP64", "shape": [1], "data": [1]}]}',
    "bad datatype": b'{"inputs": [{"name": "image", "datatype": "WAT", "shape": [1], "data": [1]}]}',
    "shape vs data": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [3], "data": [1]}]}',
    "huge declared shape": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [4000000000], '
                           b'"data": [1]}]}',
    "negative shape": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [-3], "data": []}]}',
    "string data": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], "data": ["x"]}]}',
    "out of range": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], "data": [300]}]}',
    "NaN token": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], "data": [NaN]}]}',
    "Infinity token": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], '
                      b'"data": [Infinity]}]}',
    "float for int": b'{"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1], "data": [1.5]}]}',
    "deeply nested": b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not utf-8": b'{"inputs": "\xff\xfe"}',
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_bodies_get_a_clear_400(node: Server, case: str) -> None:
    raw = BAD_BODIES[case]
    if len(raw) > MAX_PAYLOAD:
        raw = raw[: MAX_PAYLOAD - 10]  # the deep nesting within the payload limit
    status, body = post_raw(node, raw)
    assert status == 400, (case, status, body)
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body


def test_oversized_body_is_413(node: Server) -> None:
    status, body = post_raw(node, b'{"inputs": [' + b" " * (2 * MAX_PAYLOAD) + b"]}")
    assert status == 413 and "error" in body


def test_unknown_paths_and_methods(node: Server) -> None:
    assert http("GET", node.url + "/nope")[0] == 404
    assert http("GET", node.url + "/v2/models/nope")[0] == 404
    assert post_raw(node, json.dumps(image(2)).encode(), "/v2/models/nope/infer")[0] == 404
    assert http("DELETE", node.url + "/v2/models/tiny/infer")[0] == 405
    assert http("PUT", node.url + "/v2/health/ready", {})[0] == 405


def test_node_survives_the_bad_requests(node: Server) -> None:
    rss_before = _rss_kb(node.proc.pid)
    for _ in range(3):
        for raw in BAD_BODIES.values():
            post_raw(node, raw[:MAX_PAYLOAD])
    assert_healthy(node)
    # Bounded memory: hundreds of rejected requests do not grow the frontend by more than 32 MB.
    assert _rss_kb(node.proc.pid) - rss_before < 32 * 1024


def test_slow_and_idle_connections_do_not_block_service(node: Server) -> None:
    host, port = "127.0.0.1", node.port
    slow: list[socket.socket] = []
    try:
        for _ in range(64):  # slowloris: headers started, never finished
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
            slow.append(s)
        for _ in range(200):  # many idle connections
            slow.append(socket.create_connection((host, port), timeout=5))
        t0 = time.monotonic()
        assert_healthy(node, n=5)
        assert time.monotonic() - t0 < 10
    finally:
        for s in slow:
            s.close()
    assert_healthy(node, n=5)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children,
                                                                       max_size=5),
    max_leaves=30,
)
tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["image", "zz", ""]) | st.text(max_size=5),
     "datatype": st.sampled_from(["UINT8", "FP32", "INT64", "BYTES", "BOOL", "x"]),
     "shape": st.lists(st.integers(-2, 2**40), max_size=4) | json_values,
     "data": st.lists(st.integers(-5, 300) | st.floats(allow_nan=False) | st.text(max_size=3),
                      max_size=8) | json_values},
)
bodies = st.fixed_dictionaries({"inputs": st.lists(tensor, max_size=3) | json_values},
                               optional={"id": json_values, "parameters": json_values,
                                         "outputs": json_values})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(body=bodies | json_values)
def test_fuzzed_requests_get_200_or_a_clear_4xx(node: Server, body: object) -> None:
    status, out = post_raw(node, json.dumps(body).encode()[:MAX_PAYLOAD * 2])
    assert status in (200, 400, 413), (status, out, body)
    if status != 200:
        assert isinstance(out, dict) and out.get("error"), out


def test_invariants_after_fuzzing(node: Server) -> None:
    assert_healthy(node)
