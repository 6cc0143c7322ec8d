"""What a client connection may hold, on both HTTP front ends: head sizes, timeouts, a bound on
open connections (``[server]`` settings, ``HttpLimits``).

Why: without them a client that sends a huge or endless head, never sends a byte, or stalls a
body holds the daemon's memory and sockets for as long as it likes, and 10,000 such clients
hold them all. Here:

- a request line over ``max_request_line_bytes`` -> 414; header lines over ``max_header_bytes``
  (the fast front end: together; aiohttp: each) or more than ``max_headers`` of them -> 431;
- a head not complete ``header_timeout_s`` after its first byte (or after the connection opened,
  for its first request) -> 408 (a connection that never sent a byte is just closed); a body not
  complete ``body_timeout_s`` after its head -> 408; an idle keep-alive connection closes after
  ``keepalive_timeout_s``;
- at most ``max_connections`` open: a new one closes the least recently active connection that
  owes no answer (an idle one, a trickling head or a stalled body: nginx's reusable connections),
  or is refused (503, closed) when every open one owes answers. A connection that never completed
  a request (a silent one, a first head or body that never ends: what a flood opens) goes before
  a client's keep-alive connection that has, so a flood does not close the pools of clients
  that are being served.

``OpenConnections`` holds every connection of a site, least recently active first, and sweeps
their timeouts; ``LimitedHandler`` is aiohttp's request handler with these limits and JSON error
bodies (aiohttp's own would answer 400 with a logged traceback).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

SWEEP_MAX_S = 1.0


@dataclass(frozen=True)
class HttpLimits:
    """The ``[server]`` limits a front end applies to each connection (plain data)."""

    max_payload_bytes: int = 16 * 1024 * 1024
    max_request_line_bytes: int = 8190
    max_header_bytes: int = 16384
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 30.0
    max_connections: int = 4096

    @classmethod
    def of(cls, server: Any) -> HttpLimits:
        """The limits of a ``node.ServerSettings``."""
        return cls(**{k: getattr(server, k) for k in cls.__dataclass_fields__})

    def aiohttp_kwargs(self) -> dict[str, Any]:
        """aiohttp's request handler arguments for these limits (``web.AppRunner(**...)``)."""
        return {"keepalive_timeout": self.keepalive_timeout_s, "max_line_size": self.max_request_line_bytes,
                "max_field_size": self.max_header_bytes, "max_headers": self.max_headers}

    def backlog(self) -> int:
        """The listen backlog: connections the kernel completes before the node accepts them. A
        flood of connects overflows aiohttp's 128, and a client's connect is then dropped and
        retried a second later (the kernel caps it at net.core.somaxconn)."""
        return max(128, min(self.max_connections, 4096))

    def sweep_s(self) -> float:
        return max(0.05, min(SWEEP_MAX_S, self.header_timeout_s / 4, self.body_timeout_s / 4))


class Connection(Protocol):
    def evictable(self) -> bool: ...
    def served(self) -> bool: ...
    def evict(self) -> None: ...
    def check_timeouts(self, now: float) -> None: ...


class OpenConnections:
    """A site's open connections, least recently active first, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.conns: OrderedDict[Connection, None] = OrderedDict()
        self.evicted = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self.conns)

    def add(self, conn: Connection) -> None:
        self.conns[conn] = None

    def touch(self, conn: Connection) -> None:
        if conn in self.conns:
            self.conns.move_to_end(conn)

    def discard(self, conn: Connection) -> None:
        self.conns.pop(conn, None)

    def make_room(self) -> bool:
        """Room for one more: closes the least recently active connection that owes no answer
        when at the limit; False when none can go."""
        while len(self.conns) >= self.limit:
            victim = next((c for c in self.conns if c.evictable() and not c.served()), None)
            if victim is None:
                victim = next((c for c in self.conns if c.evictable()), None)
            if victim is None:
                self.refused += 1
                return False
            conn = victim
            self.conns.pop(conn)
            conn.evict()
            self.evicted += 1
        return True

    def sweep(self, now: float) -> None:
        for conn in list(self.conns):
            conn.check_timeouts(now)

    def close_all(self) -> None:
        for conn in list(self.conns):
            conn.evict()
        self.conns.clear()


def error_bytes(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 JSON error answer that closes the connection."""
    from http import HTTPStatus
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class Refused(asyncio.Protocol):
    """A connection over ``max_connections`` when every open one owes answers: 503, closed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t: asyncio.Transport = transport  # type: ignore[assignment]
        t.write(error_bytes(503, f"the server holds its limit of {self.limit} open connections "
                                 "(server.max_connections); retry later"))
        t.close()


class LimitedHandler(RequestHandler):
    """aiohttp's request handler, in ``OpenConnections``, its head timed and its parse errors
    answered with the right status (414, 431, 400) and a JSON body, without a traceback."""

    def __init__(self, server: web.Server, limits: HttpLimits, conns: OpenConnections) -> None:
        # ``server._kwargs`` are the runner's handler arguments (``HttpLimits.aiohttp_kwargs``)
        super().__init__(server, loop=asyncio.get_running_loop(), **server._kwargs)
        self.limits = limits
        self.open_conns = conns
        self.head_began = -1.0  # loop time a head began to arrive (or the connection opened); -1: none
        self.got_bytes = False  # the head timed now has a byte (else the connection just closes)

    # ---- the connection's life ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.head_began = self._loop.time()
        self.open_conns.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.open_conns.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        conns = self.open_conns
        conns.touch(self)
        if self.head_began < 0 and self._current_request is None and not self._messages:
            self.head_began = self._loop.time()
        self.got_bytes = True
        n = len(self._messages)
        super().data_received(data)
        if len(self._messages) > n:
            self.head_began = -1.0
            self.got_bytes = False

    def evictable(self) -> bool:
        return self._current_request is None and not self._messages

    def served(self) -> bool:
        """A request of this connection was parsed whole (aiohttp counts it at its head)."""
        return self._request_count > 0

    def evict(self) -> None:
        self.force_close()

    def check_timeouts(self, now: float) -> None:
        """A head not complete ``header_timeout_s`` after it began: 408 (or just closed when not
        a byte came); idle keep-alive and stalled bodies are aiohttp's and the handler's."""
        if self.head_began < 0 or self._current_request is not None or self._messages:
            return
        limit = self.limits.header_timeout_s
        if now - self.head_began > limit and self.transport is not None:
            if self.got_bytes:
                self.transport.write(error_bytes(408, f"request timeout: its head did not arrive within "
                                                      f"{limit:g} s (server.header_timeout_s)"))
            self.open_conns.discard(self)
            self.force_close()

    # ---- aiohttp's error answers ----------------------------------------------------------------
    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A client's broken body (bad gzip data, cut short) was answered 400 or 408 already; aiohttp
        would log it again, with a traceback, as it drains the rest after the answer."""
        if isinstance(kw.get("exc_info"), (RequestPayloadError, HttpProcessingError)):
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        status, text = parse_error(exc, self.limits)
        resp = web.json_response({"error": text}, status=status)
        resp.force_close()
        return resp


def parse_error(exc: HttpProcessingError, limits: HttpLimits) -> tuple[int, str]:
    """The status and message of an aiohttp parse error: 414, 431 or 400."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        if limit == limits.max_request_line_bytes and limit != limits.max_header_bytes:
            return 414, (f"request line: longer than the limit of {limits.max_request_line_bytes} bytes "
                         "(server.max_request_line_bytes)")
        return 431, (f"headers: a header line is longer than the limit of {limits.max_header_bytes} bytes "
                     "(server.max_header_bytes)")
    if "Too many headers" in str(exc.message):
        return 431, f"headers: more than the limit of {limits.max_headers} (server.max_headers)"
    return 400, f"malformed HTTP request: {exc.message}"


def handler_factory(server: web.Server, limits: HttpLimits, conns: OpenConnections) -> asyncio.Protocol:
    """A protocol for a new connection: a ``LimitedHandler`` when there is room, else ``Refused``."""
    if not conns.make_room():
        return Refused(limits.max_connections)
    return LimitedHandler(server, limits, conns)


class AiohttpSite(web.SockSite):
    """aiohttp's site on a bound socket, every connection a ``LimitedHandler``: ``[server] http =
    "aiohttp"``."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: HttpLimits) -> None:
        super().__init__(runner, sock, backlog=limits.backlog())
        self.limits = limits
        self.conns = OpenConnections(limits.max_connections)
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(lambda: handler_factory(server, self.limits, self.conns),
                                                sock=self._sock, backlog=self._backlog)
        self._sweeper = loop.call_later(self.limits.sweep_s(), self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self.conns.sweep(loop.time())
        self._sweeper = loop.call_later(self.limits.sweep_s(), self._sweep)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await super().stop()


def bind_listener(host: str, port: int) -> socket.socket:
    """The node's listening socket, bound (not yet listening: a client is refused until the node
    serves); ``OSError`` when the address is taken or cannot be bound."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
