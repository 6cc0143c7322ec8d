"""The HTTP/1.1 edges of the front end, over raw sockets: pipelining, limits, malformed requests,
clients that go away or trickle, a connection that leaves the hot routes (``runtime/fasthttp.py``
hands it to aiohttp). Each runs against both front ends (the conftest's ``http_front``) unless it
tests what only the fast one does.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
import zlib

import numpy as np
import pytest
from dpserver import http, image, write_tiny

INFER = "/v2/models/tiny/infer"
LIMITS = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "keepalive_timeout_s": 1.5,
          "max_request_line_bytes": 1024, "max_header_bytes": 2048, "max_headers": 20, "max_connections": 12}


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\n"
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    return head.encode() + b"\r\n" + body


def infer(rid: str, n: int = 4) -> bytes:
    return request("POST", INFER, json.dumps(image(n, rid=rid)).encode())


class Reader:
    """Reads HTTP/1.1 responses (Content-Length bodies) off a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed; got {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError("connection closed mid-body")
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    def closed(self) -> bool:
        """True when the server closes the connection (EOF or reset) with nothing more to read."""
        try:
            return not self._fill() and not self.buf
        except ConnectionResetError:
            return True


@pytest.fixture
def tiny(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 60.0}, 1)], max_payload_bytes=4096,
                      latency_slo_ms=2000.0, server=LIMITS)
    return server_factory(args)


def connect(server) -> tuple[socket.socket, Reader]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=15)
    return sock, Reader(sock)


def test_pipelined_requests_are_answered_in_order(tiny):
    sock, r = connect(tiny)
    with sock:
        # a 60 ms request, an instant 400, another request, a health check: all in one write
        sock.sendall(infer("first") + request("POST", INFER, b"{nope") + infer("third")
                     + request("GET", "/v2/health/live"))
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "first"
        status, _, body = r.response()
        assert status == 400 and "JSON" in json.loads(body)["error"]
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "third"
        assert r.response()[:1] == (200,)
        # the connection stays open for more
        sock.sendall(infer("fourth"))
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "fourth"


def test_a_non_hot_route_on_a_connection_that_started_hot(tiny):
    sock, r = connect(tiny)
    with sock:
        sock.sendall(infer("hot"))
        assert r.response()[0] == 200
        sock.sendall(request("GET", "/metrics"))
        status, headers, body = r.response()
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert b'jigsaw_inference_request_success_total{app="tiny"} 1' in body
        # the rest of the connection, hot or not, is answered too (in order when pipelined)
        sock.sendall(infer("after") + request("GET", "/v2/models/tiny") + request("GET", INFER))
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "after"
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["name"] == "tiny"
        status, headers, body = r.response()
        assert status == 405 and "POST" in headers["allow"] and "error" in json.loads(body)
    # pipelined behind a hot request that is still running
    sock, r = connect(tiny)
    with sock:
        sock.sendall(infer("slow") + request("GET", "/v2") + infer("last"))
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "slow"
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["name"] == "jigsaw"
        status, _, body = r.response()
        assert status == 200 and json.loads(body)["id"] == "last"


def test_oversized_body_is_413_and_malformed_is_400_then_closed(tiny, http_front):
    sock, r = connect(tiny)
    with sock:
        body = json.dumps(image(3000)).encode()  # over max_payload_bytes = 4096
        sock.sendall(request("POST", INFER, body))
        status, _, got = r.response()
        assert status == 413 and "4096" in json.loads(got)["error"]
        if http_front == "fast":  # aiohttp keeps the connection (it read the body)
            assert r.closed()
    sock, r = connect(tiny)
    with sock:
        sock.sendall(b"GARBAGE / HTTP/1.1\r\n\r\n")
        status, _, got = r.response()
        assert status == 400
        if http_front == "fast":
            assert "malformed" in json.loads(got)["error"]
        assert r.closed()
    sock, r = connect(tiny)
    with sock:
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".encode())
        assert r.response()[0] == 400
        assert r.closed()
    assert http("POST", tiny.url + INFER, image(4))[0] == 200


def test_fast_front_refuses_an_oversized_body_without_reading_it(tiny, http_front):
    if http_front != "fast":
        pytest.skip("aiohttp reads the body up to the limit before it answers 413")
    sock, r = connect(tiny)
    with sock:
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n".encode())
        status, _, got = r.response()
        assert status == 413 and "max_payload_bytes" in json.loads(got)["error"]
        assert r.closed()


def test_expect_continue_and_chunked_bodies(tiny):
    body = json.dumps(image(4, rid="cont")).encode()
    sock, r = connect(tiny)
    with sock:
        sock.sendall(request("POST", INFER, headers={"Expect": "100-continue"})
                     .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        assert r.response()[0] == 100
        sock.sendall(body)
        status, _, got = r.response()
        assert status == 200 and json.loads(got)["id"] == "cont"
    sock, r = connect(tiny)
    with sock:
        chunked = (f"POST {INFER} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                   + b"%x\r\n" % len(body[:10]) + body[:10] + b"\r\n"
                   + b"%x\r\n" % len(body[10:]) + body[10:] + b"\r\n0\r\n\r\n")
        sock.sendall(chunked)
        status, _, got = r.response()
        assert status == 200 and json.loads(got)["id"] == "cont"


def _metric(url: str, line: str) -> float:
    text = http("GET", url + "/metrics")[1]
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    return 0.0


def test_client_gone_mid_request_is_answered_once_internally(tiny):
    ok = 'jigsaw_inference_request_success_total{app="tiny"}'
    before = _metric(tiny.url, ok)
    for i in range(5):
        sock = socket.create_connection(("127.0.0.1", tiny.port), timeout=15)
        sock.sendall(infer(f"gone-{i}"))
        sock.close()  # before the 60 ms task answers
    deadline = time.monotonic() + 10
    while _metric(tiny.url, ok) < before + 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(tiny.url, ok) == before + 5
    assert _metric(tiny.url, 'jigsaw_inference_pending_requests{app="tiny"}') == 0
    assert http("GET", tiny.url + "/v2/health/ready")[0] == 200
    assert http("POST", tiny.url + INFER, image(4))[0] == 200


def test_slowloris_is_bounded_by_the_header_timeout(tiny, http_front):
    sock, r = connect(tiny)
    with sock:
        t0 = time.monotonic()
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: t\r\n".encode())
        status = None
        for i in range(40):  # one header byte every 0.1 s: never a complete head
            try:
                sock.sendall(b"X-Slow-%d: y\r\n" % i)
            except OSError:
                break
            time.sleep(0.1)
            sock.settimeout(0.01)
            try:
                if r._fill():
                    sock.settimeout(15)
                    status = r.response()[0]
                    break
            except TimeoutError:
                pass
            except OSError:
                break
        sock.settimeout(15)
        if status is None:
            status = r.response()[0]
        assert status == 408
        assert time.monotonic() - t0 < 3.5  # header_timeout_s = 1, swept every 0.25 s
    assert http("POST", tiny.url + INFER, image(4))[0] == 200


def _refused(server, data: bytes) -> tuple[int, str]:
    """Send ``data`` on a new connection: the status and error of the answer, the connection closed."""
    sock, r = connect(server)
    with sock:
        with contextlib.suppress(OSError):  # the server may answer and close before taking every byte
            sock.sendall(data)
        status, _, got = r.response()
        assert r.closed()
    return status, json.loads(got)["error"]


def test_heads_over_the_limits_are_refused_without_a_traceback(tiny):
    long_url = INFER + "?" + "x" * 2000  # max_request_line_bytes = 1024
    status, error = _refused(tiny, request("POST", long_url, b"{}"))
    assert status == 414 and "max_request_line_bytes" in error
    status, error = _refused(tiny, request("GET", "/v2/health/live", headers={"X-Big": "y" * 3000}))
    assert status == 431 and "max_header_bytes" in error  # max_header_bytes = 2048
    many = {f"X-{i}": "y" for i in range(30)}
    status, error = _refused(tiny, request("GET", "/v2/models/tiny", headers=many))
    assert status == 431 and "max_headers" in error  # max_headers = 20
    # a 1 MB URL and an endless header line: refused as they arrive, not buffered
    status, _ = _refused(tiny, b"GET /" + b"u" * (1 << 20) + b" HTTP/1.1\r\n\r\n")
    assert status == 414
    status, _ = _refused(tiny, b"GET /v2/health/live HTTP/1.1\r\nX-Endless: " + b"z" * (1 << 20))
    assert status == 431
    assert http("POST", tiny.url + INFER, image(4))[0] == 200
    log = tiny.log_path.read_text()
    assert "Traceback" not in log and "Error handling request" not in log


def _wait_closed(sock: socket.socket, r: Reader, within_s: float) -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (inf: not within ``within_s``) and what it sent."""
    t0 = time.monotonic()
    sock.settimeout(within_s)
    try:
        while r._fill():
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return float("inf"), r.buf
    return time.monotonic() - t0, r.buf


def test_idle_silent_and_stalled_connections_are_closed(tiny):
    # never a byte: closed after header_timeout_s (1 s), nothing sent
    sock, r = connect(tiny)
    with sock:
        took, got = _wait_closed(sock, r, 10)
        assert got == b"" and 0.8 < took < 3.0
    # idle keep-alive after an answer: closed after keepalive_timeout_s (1.5 s)
    sock, r = connect(tiny)
    with sock:
        sock.sendall(infer("idle"))
        assert r.response()[0] == 200
        took, got = _wait_closed(sock, r, 10)
        assert got == b"" and 1.2 < took < 4.0
    # a body that stalls: 408 after body_timeout_s (1 s)
    sock, r = connect(tiny)
    with sock:
        body = json.dumps(image(4)).encode()
        sock.sendall(request("POST", INFER, body)[:-len(body) // 2])
        t0 = time.monotonic()
        status, _, got = r.response()
        assert status == 408 and "body_timeout_s" in json.loads(got)["error"]
        assert time.monotonic() - t0 < 3.5
        assert r.closed()
    assert http("POST", tiny.url + INFER, image(4))[0] == 200


def test_open_connections_are_bounded_by_closing_the_least_recently_active(tiny):
    idle = []
    try:
        for _ in range(12):  # max_connections = 12, each silent for less than header_timeout_s
            idle.append(connect(tiny))
            time.sleep(0.01)
        for _ in range(2):  # a new connection closes the least recently active that owes nothing
            assert http("POST", tiny.url + INFER, image(4))[0] == 200
            idle.append(connect(tiny))
        closed = [i for i, (s, r) in enumerate(idle) if _wait_closed(s, r, 0.05)[0] < 1]
        # 16 connections made, 12 open at most: the oldest closed first, the newest kept
        assert 2 <= len(closed) <= 4 and closed == list(range(len(closed)))
    finally:
        for s, _ in idle:
            s.close()


def test_compressed_bodies_in_and_out(tiny):
    body = json.dumps(image(4, rid="zip")).encode()
    for enc, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                      ("deflate", zlib.compress(body)[2:-4])):  # zlib's format, and raw deflate too
        status, _, got = _one(tiny, request("POST", INFER, data, headers={"Content-Encoding": enc}))
        assert status == 200 and json.loads(got)["id"] == "zip", (enc, got)
    for accept, enc, unzip in (("gzip", "gzip", gzip.decompress),
                               ("deflate;q=0.5, br", "deflate", zlib.decompress)):
        status, headers, got = _one(tiny, request("POST", INFER, body, headers={"Accept-Encoding": accept}))
        assert status == 200 and headers["content-encoding"] == enc
        assert json.loads(unzip(got))["id"] == "zip"
    status, headers, got = _one(tiny, infer("plain"))
    assert status == 200 and "content-encoding" not in headers and json.loads(got)["id"] == "plain"
    # a bomb: 64 MB of zeros in 64 KB, against max_payload_bytes = 4096
    bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
    status, _, got = _one(tiny, request("POST", INFER, bomb[:4000], headers={"Content-Encoding": "gzip"}))
    assert status == 413 and "4096" in json.loads(got)["error"]
    status, _, got = _one(tiny, request("POST", INFER, b"not gzip", headers={"Content-Encoding": "gzip"}))
    assert status == 400 and "gzip" in json.loads(got)["error"]
    time.sleep(0.2)  # aiohttp drains a refused body after its answer (and would log it then)
    assert "Traceback" not in tiny.log_path.read_text()


def _one(server, data: bytes) -> tuple[int, dict[str, str], bytes]:
    sock, r = connect(server)
    with sock:
        sock.sendall(data)
        return r.response()


def test_tritonclient_compression(tiny):
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a test extra")
    client = httpclient.InferenceServerClient(f"127.0.0.1:{tiny.port}")
    pixels = np.arange(6, dtype=np.uint8)
    inp = httpclient.InferInput("image", list(pixels.shape), "UINT8")
    inp.set_data_from_numpy(pixels, binary_data=True)
    for algo in ("gzip", "deflate"):
        result = client.infer("tiny", [inp], request_compression_algorithm=algo,
                              response_compression_algorithm=algo)
        assert result.get_response()["model_name"] == "tiny" and result.get_response()["outputs"]


def test_a_flood_of_silent_connections_closes_them_before_a_served_client(tiny):
    served, r = connect(tiny)  # a client's keep-alive connection, served once, then idle
    with served:
        served.sendall(infer("kept"))
        assert r.response()[0] == 200
        flood = [connect(tiny)[0] for _ in range(20)]  # max_connections = 12: 9 closed by the flood
        try:
            time.sleep(0.2)
            served.sendall(infer("again"))  # the oldest connection, but the only one that was served
            status, _, body = r.response()
            assert status == 200 and json.loads(body)["id"] == "again"
        finally:
            for s in flood:
                s.close()
