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
- Limits (``httplimits.HttpLimits``, the same on aiohttp): a Content-Length over
  ``max_payload_bytes`` -> 413 and close, without reading the body; a request line over
  ``max_request_line_bytes`` -> 414, header lines over ``max_header_bytes`` together or more than
  ``max_headers`` -> 431, checked as the bytes arrive (a head is never buffered past them); a
  malformed request -> 400 and close; a head not complete ``header_timeout_s`` after its first
  byte, or a body ``body_timeout_s`` after its head, -> 408 and close (slowloris); a connection
  that sends no byte of its first request within ``header_timeout_s``, or stays idle between
  requests ``keepalive_timeout_s``, is closed; the site holds at most ``max_connections``
  (``httplimits.OpenConnections``).
- ``Content-Encoding: gzip|deflate`` bodies are inflated, bounded by ``max_payload_bytes``; an
  answer is compressed when ``Accept-Encoding`` asks (``compression``), as Triton does.
- A client that goes away mid-request does not stop the request: the dispatcher answers it once,
  as always (admission and the counters see it); the answer is just not encoded or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools
from aiohttp import web

from jigsaw.runtime.compression import BadEncoding, BodyTooLarge, compress, inflate, response_encoding
from jigsaw.runtime.http import Answer, payload_too_large
from jigsaw.runtime.httplimits import HttpLimits, LimitedHandler, OpenConnections, Refused
from jigsaw.runtime.oip import HEADER_LENGTH, encode_response, place_outputs

if TYPE_CHECKING:
    from jigsaw.runtime.dispatch import Pending
    from jigsaw.runtime.http import OipHttp
    from jigsaw.runtime.oip import InferRequest

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
        self.encoding: bytes | None = None  # Content-Encoding
        self.accept: bytes | None = None  # Accept-Encoding
        self.header_bytes = 0  # the header lines of the message so far
        self.headers = 0
        self.any_request = False  # a request began on this connection (else an idle one never sent a byte)
        self.completed = 0  # requests that arrived whole
        self.limits = site.limits
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
        self.site.conns.touch(self)
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
        if self.in_message and self.body_at < 0 and len(buf) - self.start > self.site.head_limit:
            # a line that never ends: refused before llhttp or this buffer holds more of it
            if buf.find(b"\r\n", self.start) < 0:
                self._fail(414, self._line_too_long())
            else:
                self._fail(431, self._headers_too_large())
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
        self.encoding = self.accept = None
        self.header_bytes = self.headers = 0
        self.any_request = True
        self.body_at = -1

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_request_line_bytes:
            self._fail(414, self._line_too_long())
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers += 1
        self.header_bytes += len(name) + len(value) + 4
        limits = self.limits
        if self.headers > limits.max_headers:
            self._fail(431, f"headers: more than the limit of {limits.max_headers} (server.max_headers)")
            raise _Stop
        if self.header_bytes > limits.max_header_bytes:
            self._fail(431, self._headers_too_large())
            raise _Stop
        n = name.lower()
        if n == b"content-length":
            self.content_length = int(value)  # llhttp checked the digits
        elif n == b"transfer-encoding":
            self.chunked = True
        elif n == b"expect":
            self.expect = value
        elif n == b"inference-header-content-length":
            self.header_length = value.decode("latin-1")
        elif n == b"content-encoding":
            self.encoding = value
        elif n == b"accept-encoding":
            self.accept = value

    def _line_too_long(self) -> str:
        return (f"request line: longer than the limit of {self.limits.max_request_line_bytes} bytes "
                "(server.max_request_line_bytes)")

    def _headers_too_large(self) -> str:
        return (f"headers: more than the limit of {self.limits.max_header_bytes} bytes together "
                "(server.max_header_bytes)")

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
        if self.content_length > self.limits.max_payload_bytes:
            self._fail(413, payload_too_large(self.limits.max_payload_bytes))
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
        self.completed += 1
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
        if self.encoding is not None:
            try:
                body = inflate(body, self.encoding.decode("latin-1"), self.limits.max_payload_bytes)
            except BodyTooLarge as exc:
                slot[0] = _answer_bytes(Answer(413, {"error": str(exc)}), slot[1])
                return
            except BadEncoding as exc:
                slot[0] = _answer_bytes(Answer(400, {"error": str(exc)}), slot[1])
                return
        encoding = response_encoding(self.accept.decode("latin-1")) if self.accept else None
        got = oip.infer_door(routes) or oip.infer_begin(routes, body, self.header_length)
        if isinstance(got, Answer):
            slot[0] = _answer_bytes(got, slot[1])
            return
        req, parsed = got
        # Called by the dispatcher as it answers (in the drain that read the last record), not a
        # loop turn later as a future's done-callback would be.
        req.on_answer = lambda: self._answered(slot, req, parsed, encoding)
        if req.future.done():  # answered at dispatch (an early drop)
            self._answered(slot, req, parsed, encoding)

    def _answered(self, slot: list[Any], req: Pending, parsed: InferRequest, encoding: str | None) -> None:
        if self.closed:
            return  # the client went away; the request was answered (and counted) all the same
        try:
            status, doc = req.future.result()
            if parsed.shm_outputs:  # Triton's system shared memory extension
                status, doc = place_outputs(status, doc, parsed.shm_outputs, self.oip.shm)
            payload, json_part = encode_response(doc, parsed.binary_outputs, parsed.all_binary)
            extra = _RETRY if status == 503 else b""
            if encoding is not None:
                payload = compress(payload, encoding)
                extra += b"Content-Encoding: %s\r\n" % encoding.encode()
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
        handler = self.site.aiohttp_protocol()  # takes this connection's place in ``site.conns``
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
        limits = self.limits
        if self.in_message:
            head = self.body_at < 0
            limit = limits.header_timeout_s if head else limits.body_timeout_s
            if now - self.began > limit:
                part = "its head" if head else "its body"
                setting = "header_timeout_s" if head else "body_timeout_s"
                self._fail(408, f"request timeout: {part} did not arrive within {limit:g} s "
                                f"(server.{setting})")
        elif not self.slots and self.handoff is None:
            idle_s = limits.keepalive_timeout_s if self.any_request else limits.header_timeout_s
            if now - self.last_active > idle_s:
                self.evict()

    def evictable(self) -> bool:
        """Owes no answer (``OpenConnections`` may close it to make room)."""
        return not self.slots and self.handoff is None and not self.closed

    def served(self) -> bool:
        """A request of this connection arrived whole."""
        return self.completed > 0

    def evict(self) -> None:
        self.closed = True
        self.site.conns.discard(self)
        if self.transport is not None:
            self.transport.close()


class FastSite(web.SockSite):
    """aiohttp's site whose connections start on ``FastConnection``: the hot OIP routes are
    served there, everything else by the runner's aiohttp server (``LimitedHandler``) on the same
    connection; ``limits`` bound both."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *, oip: OipHttp,
                 limits: HttpLimits) -> None:
        super().__init__(runner, sock, backlog=limits.backlog())
        self.oip = oip
        self.limits = limits
        # a head's bytes before it is refused: its request line and header lines, their line ends
        self.head_limit = limits.max_request_line_bytes + limits.max_header_bytes + 4
        self.conns = OpenConnections(limits.max_connections)
        self.loop = asyncio.get_running_loop()
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_s = limits.sweep_s()

    def aiohttp_protocol(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None
        return LimitedHandler(server, self.limits, self.conns)

    def _protocol(self) -> asyncio.Protocol:
        if not self.conns.make_room():
            return Refused(self.limits.max_connections)
        return FastConnection(self)

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._server = await self.loop.create_server(self._protocol, sock=self._sock, backlog=self._backlog)
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        self.conns.sweep(self.loop.time())
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await super().stop()
        for conn in list(self.conns.conns):
            if isinstance(conn, FastConnection):
                conn.evict()
