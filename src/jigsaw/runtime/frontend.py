"""The frontend: the data plane's side of the daemon, one object over four that each hold one concept.

- ``routing.RoutingTable``: which generation serves each app and the rings it feeds;
- ``admission.Admission``: how many requests an app may have in flight, and the bin counters;
- ``dispatch.Dispatcher``: requests to root items, retries, credits, completions, the one answer;
- ``http.OipHttp``: the Open Inference Protocol REST handlers (on aiohttp; ``fasthttp`` serves
  the hot routes on the same listening socket with the same code).

The generation manager pushes state into it through the ``Router`` methods (``add_generation``,
``route``, ``reweight``, ``remove_generation``, and the worker-fault reports); the controller reads
the bin counters (``peek_bin``, ``take_bin``). Nothing outside reaches into the four parts.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from jigsaw.backends.registry import BackendKind
from jigsaw.node import ServerSettings
from jigsaw.plan import Plan
from jigsaw.runtime.admission import Admission, BinCounters
from jigsaw.runtime.dispatch import Dispatcher
from jigsaw.runtime.fasthttp import FastSite
from jigsaw.runtime.http import OipHttp, ServingState
from jigsaw.runtime.httplimits import AiohttpSite, HttpLimits
from jigsaw.runtime.metrics import Metrics
from jigsaw.runtime.routing import RoutingTable
from jigsaw.runtime.topology import Topology


class Frontend:
    """Owns the producer side of the root rings and the consumer side of the completion rings."""

    def __init__(self, backend: BackendKind, *, max_queue: int = 4096, hop_latency_ms: float = 10.0,
                 time_scale: float = 1.0, seed: int = 0) -> None:
        self.metrics = Metrics(backend.name)
        self.routing = RoutingTable(backend, self.metrics)
        self.admission = Admission(max_queue)
        self.dispatcher = Dispatcher(self.routing, self.admission, self.metrics, backend_name=backend.name,
                                     emulated=backend.emulated, hop_latency_ms=hop_latency_ms,
                                     time_scale=time_scale, seed=seed)
        self.state = ServingState()
        self.http = OipHttp(self.routing, self.admission, self.dispatcher, self.metrics, self.state,
                            backend_name=backend.name)

    # ---- what the generation manager pushes (``generations.Router``) --------------------------
    def add_generation(self, generation: int, topology: Topology) -> None:
        """Map a generation's segments: its completions are drained from now on, requests go to
        it only after ``route``."""
        self.routing.add_generation(generation, topology)
        self.dispatcher.watch_bell()

    def route(self, app: str, generation: int) -> None:
        """Send the app's new requests to ``generation``; its admission limit follows the plan."""
        routes = self.routing.route(app, generation)
        self.admission.refresh(routes, self.routing.root_states(app))

    def unroute(self, app: str) -> None:
        """Take no more requests for ``app`` (unloaded): it is no longer served, its requests in
        flight are answered by their generation as it drains."""
        self.routing.unroute(app)

    def reweight(self, app: str, plan: Plan) -> None:
        """Run ``plan`` on the app's current processes: new lane weights, same rings."""
        routes = self.routing.reweight(app, plan)
        self.admission.refresh(routes, self.routing.root_states(app))

    def pending_in(self, generation: int) -> int:
        return self.dispatcher.pending_in(generation)

    def unanswered_in(self, generation: int) -> int:
        return self.dispatcher.unanswered_in(generation)

    def queued_end_s(self, app: str) -> float | None:
        """Wall seconds until a request of ``app`` admitted now would finish on its current
        routes (``RoutingTable.queued_end_s``); None when unknown."""
        routes = self.routing.routes.get(app)
        return None if routes is None else self.routing.queued_end_s(routes)

    def cut_generation(self, generation: int) -> tuple[int, int, int]:
        """Settle a draining generation's requests now (a re-plan needs its slots); returns
        (forgotten, resent, failed): ``Dispatcher.cut_generation``."""
        return self.dispatcher.cut_generation(generation)

    def remove_generation(self, generation: int) -> None:
        """Unmap a drained generation (its workers stopped); late records of it are discarded."""
        mapped = self.routing.remove_generation(generation)
        if mapped is not None:
            self.dispatcher.drain(mapped.completions)
            mapped.close()

    def worker_failed(self, generation: int, app: str, task: str, variant: str,
                      reason: str, suspects: frozenset[int] = frozenset()) -> tuple[int, int]:
        """Settle the requests a dead process may have held (``suspects``: the crashing batch's,
        answered 500); returns (retried, failed)."""
        self.metrics.worker_failures.inc((("app", app), ("task", task), ("reason", reason)))
        return self.dispatcher.on_worker_failed(generation, task, variant, suspects, reason)

    def worker_restarting(self, app: str, task: str) -> None:
        self.metrics.worker_restarts.inc((("app", app), ("task", task)))
        self.refresh_admission(app)

    def worker_given_up(self, app: str, task: str) -> None:
        self.metrics.worker_given_up.inc((("app", app), ("task", task)))
        self.refresh_admission(app)

    def refresh_admission(self, app: str) -> None:
        """Admission of ``app`` scaled by the share of its root processes that are up now."""
        routes = self.routing.routes.get(app)
        if routes is not None:
            self.admission.refresh(routes, self.routing.root_states(app))

    # ---- what the controller reads (``controller.BinSource``) ----------------------------------
    def peek_bin(self, app: str) -> BinCounters | None:
        return self.admission.peek_bin(app)

    def take_bin(self, app: str) -> BinCounters:
        return self.admission.take_bin(app)

    def count_planner_failure(self, app: str) -> None:
        self.metrics.planner_failures.inc((("app", app),))

    # ---- lifecycle ------------------------------------------------------------------------------
    def make_app(self, max_payload_bytes: int, body_timeout_s: float = 30.0) -> web.Application:
        return self.http.make_app(max_payload_bytes, body_timeout_s)

    def runner(self, app: web.Application, server: ServerSettings) -> web.AppRunner:
        """aiohttp's runner of ``app`` with the node's connection limits (``httplimits``)."""
        return web.AppRunner(app, access_log=None, **HttpLimits.of(server).aiohttp_kwargs())

    def site(self, runner: web.AppRunner, sock: socket.socket, server: ServerSettings) -> web.BaseSite:
        """The listening site on the bound ``sock``: ``[server] http = "fast"`` (the hot OIP
        routes on ``fasthttp``, the rest on ``runner``'s aiohttp server) or ``"aiohttp"``
        (everything on aiohttp); both hold the node's ``HttpLimits``."""
        limits = HttpLimits.of(server)
        if server.http == "aiohttp":
            return AiohttpSite(runner, sock, limits)
        return FastSite(runner, sock, oip=self.http, limits=limits)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.dispatcher.start(loop)

    def num_pending(self) -> int:
        return self.admission.total()

    def close(self) -> None:
        self.dispatcher.stop()
        self.routing.close()
