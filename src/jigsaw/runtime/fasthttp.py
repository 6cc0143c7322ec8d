"""The OIP hot path on a lean HTTP/1.1 protocol; every other request goes to aiohttp.

Why: on aiohttp the daemon spends most of a request's CPU in aiohttp's request and response
objects and the task it runs each handler in, not in parsing or dispatching. Here
``POST /v2/models/{m}[/versions/{v}]/infer`` and ``GET /v2/health/{live,ready}`` are parsed by
httptools (llhttp) and answered from pre-encoded parts by a done-callback on the dispatcher's
future: no request object, no task per request.

A connection (``FastConnection``, one per accepted socket, on the same listening socket as
aiohttp's server; ``FastSite`` replaces aiohttp's ``TCPSite``):

- Received bytes are appended to one buffer and fed to the parser, which checks the request
  line and headers (CRLF line ends, one Content-Length, not both Content-Length and chunked) and
  says where each message ends; the body is sliced from the buffer once it is complete.
- A hot request is served by the code aiohttp's handler runs (``OipHttp.find_routes``,
  ``infer_door``, ``infer_begin``, ``oip.encode_response``): the same validation, admission,
  dispatch, binary tensor extension and error bodies. Its answer is encoded and written by the
  dispatcher's call (``Pending.on_answer``) in the drain that completed it.
- Answers leave in request order: each request takes a slot in the connection's queue, and a
  slot filled early waits for the slots before it (pipelining). At most ``MAX_PIPELINE`` answers
  may be outstanding; reading pauses beyond that and while the client does not read.
- The first request that is not hot (another route or method, a chunked body, an upgrade) hands
  the connection to aiohttp: once every earlier answer is written, the transport gets aiohttp's
  ``RequestHandler`` as its protocol, fed the bytes from that request's first byte on.
- Limits: a Content-Length over ``max_payload_bytes`` -> 413 and close, without reading the body;
  a malformed request -> 400 and close; a head not complete ``header_timeout_s`` after its first
  byte, or a body not complete ``BODY_TIMEOUT_S`` after it, -> 408 and close (slowloris); an idle
  keep-alive connection closes after ``KEEPALIVE_S``, as aiohttp's do.
- A client that goes away mid-request does not stop the request: the dispatcher answers it once,
  as always (admission and the counters see it); the answer is just not encoded or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools
from aiohttp import web

from jigsaw.runtime.http import Answer, payload_too_large
from jigsaw.runtime.oip import HEADER_LENGTH, encode_response, place_outputs

if TYPE_CHECKING:
    from jigsaw.runtime.dispatch import Pending
    from jigsaw.runtime.http import OipHttp
    from jigsaw.runtime.oip import InferRequest

HEADER_TIMEOUT_S = 10.0  # default [server] header_timeout_s
BODY_TIMEOUT_S = 60.0  # a body must be complete this long after its head
KEEPALIVE_S = 75.0  # aiohttp's keep-alive timeout
MAX_PIPELINE = 64  # answers outstanding on one connection before reading pauses
LINGER_S = 2.0  # after its last answer a closing connection reads (and drops) this long, then closes

_INFER, _LIVE, _READY = 1, 2, 3
_HEALTH = {b"/v2/health/live": _LIVE, b"/v2/health/ready": _READY}
_MODELS, _INFER_TAIL = b"/v2/models/", b"/infer"

_JSON = b"Content-Type: application/json\r\n"
_JSON_TEXT = b"Content-Type: application/json; charset=utf-8\r\n"  # aiohttp's json_response
_BINARY = b"Content-Type: application/octet-stream\r\n"
_CLOSE = b"Connection: close\r\n"
_RETRY = b"Retry-After: 1\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode()
    return line


def response(status: int, body: bytes, content_type: bytes = _JSON, extra: bytes = b"",
             close: bool = False) -> bytes:
    """One HTTP/1.1 response from pre-encoded parts."""
    return b"".join((_status_line(status), content_type, b"Content-Length: %d\r\n" % len(body), extra,
                     _CLOSE if close else b"", b"\r\n", body))


def _answer_bytes(answer: Answer, close: bool) -> bytes:
    extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (answer.headers or {}).items())
    return response(answer.status, json.dumps(answer.doc).encode(), _JSON_TEXT, extra, close)


def _error_bytes(status: int, message: str) -> bytes:
    return _answer_bytes(Answer(status, {"error": message}), close=True)


class _Stop(Exception):
    """Raised in a parser callback to stop parsing this connection's bytes."""


class FastConnection(asyncio.Protocol):
    """One client connection: hot OIP requests served here, the rest handed to aiohttp."""

    def __init__(self, site: FastSite) -> None:
        self.site = site
        self.oip = site.oip
        self.loop = site.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.start = 0  # where the message being parsed may start in ``buf`` (CRLFs before it allowed)
        self.body_at = -1  # where its body starts in ``buf``; -1 until its head is complete
        self.url = b""
        self.content_length = 0
        self.chunked = False
        self.expect: bytes | None = None
        self.header_length: str | None = None  # Inference-Header-Content-Length
        self.kind = 0
        self.model = ""
        self.version: str | None = None
        self.in_message = False
        self.began = 0.0  # loop time of the message's first byte
        self.last_active = self.loop.time()
        self.slots: deque[list[Any]] = deque()  # [response bytes or None, close after it]
        self.stopped = False  # no more requests are read (an error answer closes the connection)
        self.closed = False
        self.eof = False
        self.write_paused = False
        self.reading_paused = False
        self.handoff: bytes | None = None  # bytes for aiohttp, once the earlier answers are out
        self.lingering = 0.0  # loop time its last answer went out after a write_eof (0: not closing)

    # ---- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.site.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.site.conns.discard(self)
        self.slots.clear()

    def eof_received(self) -> bool:
        self.eof = True
        return bool(self.slots) or self.handoff is not None  # keep the socket to write what is owed

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.stopped or self.closed:
            return
        self.last_active = self.loop.time()
        buf = self.buf
        buf += data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                self._fail(500, f"internal error: {exc.__context__!r}")
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")  # handed off before this in practice
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")
        if self.stopped:
            return
        if self.start:  # drop the bytes of the messages served
            del buf[:self.start]
            if self.body_at >= 0:
                self.body_at -= self.start
            self.start = 0

    # ---- httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.in_message = True
        self.began = self.loop.time()
        self.url = b""
        self.content_length = 0
        self.chunked = False
        self.expect = None
        self.header_length = None
        self.body_at = -1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-length":
            self.content_length = int(value)  # llhttp checked the digits
        elif n == b"transfer-encoding":
            self.chunked = True
        elif n == b"expect":
            self.expect = value
        elif n == b"inference-header-content-length":
            self.header_length = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        buf = self.buf
        start = self.start
        while buf[start] in (13, 10):  # CRLFs between messages, as llhttp skips them
            start += 1
        self.start = start
        self.body_at = buf.find(b"\r\n\r\n", start) + 4
        self.kind = self._route()
        if self.kind == 0 or self.chunked or self.parser.should_upgrade():
            self._hand_off(bytes(buf[start:]))
            raise _Stop
        if self.content_length > self.site.max_payload_bytes:
            self._fail(413, payload_too_large(self.site.max_payload_bytes))
            raise _Stop
        if self.expect is not None:
            if self.expect.lower() != b"100-continue":
                self._fail(417, f"Expect: {self.expect.decode('latin-1')} is not supported "
                                "(only 100-continue)")
                raise _Stop
            self.slots.append([_CONTINUE, False])
            self._flush()

    def on_message_complete(self) -> None:
        self.in_message = False
        start = self.body_at + self.content_length
        body = bytes(self.buf[self.body_at:start])
        self.start = start
        self.body_at = -1
        keep = self.parser.should_keep_alive()
        slot: list[Any] = [None, not keep]
        self.slots.append(slot)
        if not keep:
            self.stopped = True
        if self.kind == _INFER:
            self._infer(slot, body)
        else:
            ok = self.kind == _LIVE or self.oip.state.all_ready()
            doc = {"live": True} if self.kind == _LIVE else {"ready": ok}
            slot[0] = response(200 if ok else 503, json.dumps(doc).encode(), _JSON_TEXT, close=slot[1])
        self._flush()
        if self.stopped:
            raise _Stop

    # ---- serving ----------------------------------------------------------------------------------
    def _route(self) -> int:
        """Which hot route the request is (0: none, aiohttp serves it)."""
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        if method == b"GET":
            return _HEALTH.get(path, 0)
        if (method != b"POST" or not path.startswith(_MODELS) or not path.endswith(_INFER_TAIL)
                or b"%" in path):
            return 0
        parts = path[len(_MODELS):-len(_INFER_TAIL)].split(b"/")
        try:
            if len(parts) == 1 and parts[0]:
                self.model, self.version = parts[0].decode(), None
            elif len(parts) == 3 and parts[1] == b"versions" and parts[0] and parts[2]:
                self.model, self.version = parts[0].decode(), parts[2].decode()
            else:
                return 0
        except UnicodeDecodeError:
            return 0
        return _INFER

    def _infer(self, slot: list[Any], body: bytes) -> None:
        oip = self.oip
        routes = oip.find_routes(self.model, self.version)
        if isinstance(routes, Answer):
            slot[0] = _answer_bytes(routes, slot[1])
            return
        got = oip.infer_door(routes) or oip.infer_begin(routes, body, self.header_length)
        if isinstance(got, Answer):
            slot[0] = _answer_bytes(got, slot[1])
            return
        req, parsed = got
        # Called by the dispatcher as it answers (in the drain that read the last record), not a
        # loop turn later as a future's done-callback would be.
        req.on_answer = lambda: self._answered(slot, req, parsed)
        if req.future.done():  # answered at dispatch (an early drop)
            self._answered(slot, req, parsed)

    def _answered(self, slot: list[Any], req: Pending, parsed: InferRequest) -> None:
        if self.closed:
            return  # the client went away; the request was answered (and counted) all the same
        try:
            status, doc = req.future.result()
            if parsed.shm_outputs:  # Triton's system shared memory extension
                status, doc = place_outputs(status, doc, parsed.shm_outputs, self.oip.shm)
            payload, json_part = encode_response(doc, parsed.binary_outputs, parsed.all_binary)
            extra = _RETRY if status == 503 else b""
            if json_part is None:
                slot[0] = response(status, payload, _JSON, extra, slot[1])
            else:
                slot[0] = response(status, payload, _BINARY,
                                   extra + f"{HEADER_LENGTH}: {json_part}\r\n".encode(), slot[1])
        except Exception as exc:  # an answer that cannot be encoded must not take the loop down
            print(f"jigsawd: cannot encode an answer: {exc!r}", file=sys.stderr, flush=True)
            slot[0] = _error_bytes(500, "internal error: the answer could not be encoded")
            slot[1] = True
        self._flush()

    def _flush(self) -> None:
        """Write every answer whose turn has come; close or hand off when that is next."""
        slots = self.slots
        t = self.transport
        if t is None or self.closed:
            return
        while slots and slots[0][0] is not None:
            data, close = slots.popleft()
            t.write(data)
            if close:
                self._close_gracefully()
                return
        if not slots:
            self.last_active = self.loop.time()
            if self.handoff is not None:
                self._hand_off_now()
                return
            if self.eof:
                self.closed = True
                t.close()
                return
        self._update_reading()

    def _close_gracefully(self) -> None:
        """Send FIN after the last answer and drop what the client still sends until it closes
        (or ``LINGER_S``): closing a socket with unread bytes would send RST, and a client can
        lose the answer it has not read yet (an oversized body the server did not read)."""
        self.slots.clear()
        self.stopped = True
        self.in_message = False
        t = self.transport
        assert t is not None
        if self.write_paused or not t.can_write_eof():
            self.closed = True
            t.close()
            return
        t.write_eof()
        self.lingering = self.loop.time()
        if self.reading_paused:
            self.reading_paused = False
            t.resume_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or self.closed or self.lingering:
            return
        pause = self.write_paused or len(self.slots) >= MAX_PIPELINE or self.handoff is not None
        if pause != self.reading_paused:
            self.reading_paused = pause
            with contextlib.suppress(RuntimeError, AttributeError):
                if pause:
                    t.pause_reading()
                else:
                    t.resume_reading()

    def _fail(self, status: int, message: str) -> None:
        """Answer ``status`` after the answers owed, then close; read nothing more."""
        self.stopped = True
        self.in_message = False
        self.slots.append([_error_bytes(status, message), True])
        self._flush()

    # ---- handing the connection to aiohttp ---------------------------------------------------------
    def _hand_off(self, data: bytes) -> None:
        self.stopped = True
        self.in_message = False
        self.handoff = data
        if self.slots:
            self._update_reading()  # the rest waits in the socket until the earlier answers are out
        else:
            self._hand_off_now()

    def _hand_off_now(self) -> None:
        t = self.transport
        data = self.handoff or b""
        self.handoff = None
        self.closed = True  # this protocol is done with the transport
        self.site.conns.discard(self)
        if t is None or t.is_closing():
            return
        handler = self.site.aiohttp_protocol()
        t.set_protocol(handler)
        handler.connection_made(t)
        if self.reading_paused:
            t.resume_reading()
        if data:
            handler.data_received(data)
        if self.eof:
            handler.eof_received()

    # ---- timeouts (``FastSite`` sweeps every connection) -------------------------------------------
    def check_timeouts(self, now: float) -> None:
        if self.closed:
            return
        if self.lingering:
            if now - self.lingering > LINGER_S and self.transport is not None:
                self.closed = True
                self.transport.close()
            return
        if self.stopped:
            return
        if self.in_message:
            head = self.body_at < 0
            limit = self.site.header_timeout_s if head else BODY_TIMEOUT_S
            if now - self.began > limit:
                part = "its head" if head else "its body"
                self._fail(408, f"request timeout: {part} did not arrive within {limit:g} s")
        elif not self.slots and now - self.last_active > KEEPALIVE_S and self.transport is not None:
            self.closed = True
            self.transport.close()


class FastSite(web.TCPSite):
    """aiohttp's TCP site whose connections start on ``FastConnection``: the hot OIP routes are
    served there, everything else by the runner's aiohttp server on the same connection."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *, oip: OipHttp,
                 max_payload_bytes: int, header_timeout_s: float = HEADER_TIMEOUT_S) -> None:
        super().__init__(runner, host, port)
        self.oip = oip
        self.max_payload_bytes = max_payload_bytes
        self.header_timeout_s = header_timeout_s
        self.conns: set[FastConnection] = set()
        self.loop = asyncio.get_running_loop()
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_s = max(0.05, min(1.0, header_timeout_s / 4))

    def aiohttp_protocol(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return server()

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._server = await self.loop.create_server(lambda: FastConnection(self), self._host, self._port,
                                                     backlog=self._backlog, reuse_address=self._reuse_address,
                                                     reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        now = self.loop.time()
        for conn in list(self.conns):
            conn.check_timeouts(now)
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

    async def stop(self) -> None:
        await super().stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.conns):
            conn.closed = True
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
