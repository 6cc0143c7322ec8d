"""Triton's ``inference.GRPCInferenceService`` on the node's event loop (``grpc.aio``).

A second front end over the HTTP one's handlers (``http.OipHttp``: ``find_routes``,
``infer_door``, ``infer_submit``), so a gRPC request passes the same admission and dispatcher,
gets the same deadline (its ``timeout`` parameter or its call deadline, the sooner) and exactly
one answer. Errors carry HTTP's messages with the gRPC code of their status: 400
INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED, 500 INTERNAL, 501 UNIMPLEMENTED, 503
UNAVAILABLE (not ready, shutting down, a failed worker) or RESOURCE_EXHAUSTED (shed at the door),
504 DEADLINE_EXCEEDED. ``ModelStreamInfer`` answers each request of a stream as it completes
(Triton's order), an error as the response's ``error_message`` with the stream left open; at most
``STREAM_WINDOW`` requests of a stream are read ahead of the answers it has taken.

The stubs are Triton's generated ones shipped by ``tritonclient`` (``tritonclient.grpc``:
``service_pb2``, ``service_pb2_grpc``, ``model_config_pb2``), the same the clients use.
Statistics, config and the repository index are the HTTP extension's JSON (``triton_ext``)
parsed into Triton's messages: one source.

Repository messages: Triton's ``RepositoryModelLoadRequest`` / ``...UnloadRequest`` number
``repository_name`` 1 and ``model_name`` 2, while KServe's model repository protocol numbers
``model_name`` 1; a KServe-numbered client's name therefore arrives as ``repository_name``, and
a request with an empty ``model_name`` takes its name from there. KServe's responses carry
``model_name`` (1) and ``isLoaded`` / ``isUnloaded`` (2), Triton's none: such a client reads our
(Triton's, empty) answer as not loaded; the call's OK status is what says it was done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from jigsaw import __version__
from jigsaw.runtime import triton_ext as ext
from jigsaw.runtime.grpc_codec import encode_grpc_response, parse_grpc_request
from jigsaw.runtime.http import EXTENSIONS, Answer, OipHttp
from jigsaw.runtime.oip import BadRequest, place_outputs

C = grpc.StatusCode
STREAM_WINDOW = 1024  # a stream's requests read and not yet answered (the rest wait in flow control)
_CODES = {
    400: C.INVALID_ARGUMENT,
    404: C.NOT_FOUND,
    405: C.UNIMPLEMENTED,
    413: C.RESOURCE_EXHAUSTED,
    500: C.INTERNAL,
    501: C.UNIMPLEMENTED,
    503: C.UNAVAILABLE,
    504: C.DEADLINE_EXCEEDED,
}


class Refused(Exception):
    """A call answered with an error: the gRPC code and HTTP's message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def code_of(status: int, doc: dict[str, Any], reason: str = "") -> grpc.StatusCode:
    if status == 503 and (reason == "shed" or doc.get("reason") == "shed"):
        return C.RESOURCE_EXHAUSTED
    return _CODES.get(status, C.UNKNOWN)


def _refused(answer: Answer) -> Refused:
    return Refused(code_of(answer.status, answer.doc, answer.reason), str(answer.doc.get("error", "")))


class OipGrpc(pbg.GRPCInferenceServiceServicer):
    """The servicer: each method over the HTTP front end's handlers and documents."""

    def __init__(self, oip: OipHttp) -> None:
        self.oip = oip

    # ---- inference ---------------------------------------------------------------------------
    async def infer(
        self, request: pb.ModelInferRequest, time_remaining_s: float | None
    ) -> pb.ModelInferResponse:
        """One request through the door, admission and the dispatcher; ``Refused`` on an error."""
        oip = self.oip
        routes = oip.find_routes(request.model_name, request.model_version or None)
        if isinstance(routes, Answer):
            raise _refused(routes)
        shut = oip.infer_door(routes)
        if shut is not None:
            raise _refused(shut)
        try:
            parsed = parse_grpc_request(request, routes.app, oip.shm, time_remaining_s)
        except BadRequest as exc:
            oip.metrics.failure.inc((("app", routes.app.name), ("reason", "bad_request")))
            raise Refused(C.INVALID_ARGUMENT, str(exc)) from None
        got = oip.infer_submit(routes, parsed)
        if isinstance(got, Answer):
            raise _refused(got)
        req, parsed = got
        # (a cancelled call cancels the future: the dispatcher still settles and counts the request)
        status, doc = await req.future
        if parsed.shm_outputs:
            status, doc = place_outputs(status, doc, parsed.shm_outputs, oip.shm)
        if status != 200:
            raise Refused(code_of(status, doc), str(doc.get("error", "")))
        return encode_grpc_response(doc)

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        try:
            return await self.infer(request, context.time_remaining())
        except Refused as exc:
            await context.abort(exc.code, str(exc))
            raise  # (abort raises)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        window = asyncio.Semaphore(STREAM_WINDOW)  # requests read and not yet answered on the wire

        async def one(request: pb.ModelInferRequest) -> None:
            try:
                answers.put_nowait(
                    pb.ModelStreamInferResponse(infer_response=await self.infer(request, None))
                )
            except Refused as exc:
                answers.put_nowait(
                    pb.ModelStreamInferResponse(
                        error_message=str(exc),
                        infer_response=pb.ModelInferResponse(model_name=request.model_name, id=request.id),
                    )
                )

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await window.acquire()  # a client that does not read its answers is not read
                    task = asyncio.ensure_future(one(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(list(running))
            finally:
                answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
                window.release()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    # ---- health and metadata -----------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.oip.state.all_ready())  # (strict: every app serves)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="jigsaw", version=__version__, extensions=list(EXTENSIONS))

    async def _routes(self, request: Any, context: Any) -> Any:
        routes = self.oip.find_routes(request.name, request.version or None)
        if isinstance(routes, Answer):  # unknown (NOT_FOUND), or failed to load (UNAVAILABLE)
            await context.abort(code_of(routes.status, routes.doc), routes.doc["error"])
        return routes

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        if request.name in self.oip.state.failed_apps:  # an app that failed to load: not ready
            return pb.ModelReadyResponse(ready=False)
        await self._routes(request, context)
        return pb.ModelReadyResponse(ready=self.oip.state.accepting())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        app = (await self._routes(request, context)).app
        oip = self.oip
        T = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=app.name,
            versions=["1"],
            platform=f"jigsaw_{oip.backend_name}",
            inputs=[T(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in app.inputs],
            outputs=[
                T(name=f"{task}.{s.name}", datatype=s.datatype, shape=[-1, *s.shape[1:]])
                for task, specs in oip.routing.output_specs[app.name].items()
                for s in specs
            ],
        )

    # ---- extensions --------------------------------------------------------------------------
    async def _ext(self, context: Any, fn: Any, *args: Any) -> Any:
        try:
            got = fn(*args)
            return await got if asyncio.iscoroutine(got) else got
        except ext.ExtError as exc:
            await context.abort(code_of(exc.status, {}), str(exc))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        doc = await self._ext(context, ext.statistics, self.oip, request.name, request.version or None)
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        doc = await self._ext(context, ext.config, self.oip, request.name, request.version or None)
        return pb.ModelConfigResponse(
            config=json_format.ParseDict(doc, mc.ModelConfig(), ignore_unknown_fields=True)
        )

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        M = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[M(**e) for e in ext.repository_index(self.oip, request.ready)]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self._ext(
            context, ext.repository_call, self.oip, "load", request.model_name or request.repository_name
        )
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await self._ext(
            context, ext.repository_call, self.oip, "unload", request.model_name or request.repository_name
        )
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        regions = await self._ext(context, ext.shm_call, self.oip.shm.status, request.name)
        R = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: R(**r) for r in regions})

    async def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._ext(
            context,
            ext.shm_call,
            self.oip.shm.register,
            request.name,
            request.key,
            request.offset,
            request.byte_size,
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._ext(context, ext.shm_call, self.oip.shm.unregister, request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def _no_cuda(self, request: Any, context: Any) -> Any:
        await context.abort(
            C.UNIMPLEMENTED, "CUDA shared memory is not supported by this server; use system shared memory"
        )

    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _no_cuda

    async def _unimplemented(self, request: Any, context: Any) -> Any:
        await context.abort(C.UNIMPLEMENTED, "not supported by this server (no trace or log settings)")

    TraceSetting = LogSettings = _unimplemented


async def start_grpc(oip: OipHttp, host: str, port: int, max_message_bytes: int) -> grpc.aio.Server:
    """Serve ``OipGrpc`` on ``host:port`` (bound without SO_REUSEPORT: a port in use is an error,
    not a second server beside the first); ``OSError`` when it cannot bind."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
    )
    pbg.add_GRPCInferenceServiceServicer_to_server(OipGrpc(oip), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"gRPC: cannot bind {address}: {exc}") from None
    if not bound:
        raise OSError(f"gRPC: cannot bind {address}")
    await server.start()
    return server
