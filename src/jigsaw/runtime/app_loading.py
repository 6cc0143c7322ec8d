"""Taking an app off the node and putting it back (Triton's repository unload / load): a part of
``GenerationManager`` (``AppLoading`` is its base): unload drains the app's generation and frees
its slots; load places its last plan beside the others and starts it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from jigsaw.app import App
from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import NodeLayout
from jigsaw.plan import Plan
from jigsaw.planner.packer import PackingError
from jigsaw.runtime.applied import READY_TIMEOUT_S
from jigsaw.runtime.generation import Generation

if TYPE_CHECKING:
    from jigsaw.gpu.partition import MigPartition
    from jigsaw.runtime.applied import Router
    from jigsaw.runtime.placement import Beside



class AppLoading:
    """Unload and load of one app (a base of ``GenerationManager``)."""

    current: dict[str, int]
    node_layout: NodeLayout | None
    partition: MigPartition | None
    _retiring: set[asyncio.Task[None]]
    _lock: asyncio.Lock
    log: Callable[[str], None]

    def _router(self) -> Router: ...
    def beside(self) -> Beside | None: ...
    def place(self, app: str, plan: Plan) -> tuple[NodeLayout | None, Plan]: ...
    def _lay_out(self, app: App, plan: Plan) -> Generation: ...
    async def _launch(self, gen: Generation, layout: NodeLayout | None, router: Router,
                      hold_s: float = 0.0) -> None: ...
    async def _abandon(self, gen: Generation) -> None: ...
    async def _release_mig(self, reason: str) -> None: ...
    async def _drain_and_retire(self, gid: int) -> None: ...

    async def unload_app(self, app: str) -> None:
        """Stop serving ``app`` (Triton's repository unload): new requests no longer reach it, its
        generation drains (every request answered) and retires, and its MIG instances and MPS
        daemons go; returns once they have. The node layout keeps none of its slots."""
        async with self._lock:
            gid = self.current.pop(app)
            self._router().unroute(app)
            if self.node_layout is not None:
                self.node_layout = self.node_layout.with_instances(
                    i for i in self.node_layout.instances if i.app != app)
        self.log(f"{app}: unloaded; generation {gid} drains")
        await self._drain_and_retire(gid)

    async def load_app(self, app: App, plan: Plan) -> None:
        """Serve ``app`` again on ``plan`` (Triton's repository load), placed beside the other apps'
        instances; returns once every process is ready and the app is routed. Raises
        ``JigsawError`` (nothing left running) when it does not fit or does not start."""
        router = self._router()
        if self._retiring:  # the drains in its way end first (their slots are freed at the end)
            await asyncio.wait(list(self._retiring), timeout=READY_TIMEOUT_S)
        async with self._lock:
            if app.name in self.current:
                return
            beside = self.beside()  # off every slot that runs or drains, where it fits so
            got = beside.place(app.name, dataclasses.replace(plan, layout=None)) \
                if beside is not None else None
            try:
                node_layout, plan = got if got is not None else self.place(app.name, plan)
            except PackingError as exc:
                raise JigsawError(f"its plan does not fit beside the node's other apps ({exc})") from None
            if self.partition is not None and node_layout is not None:
                deferred = await asyncio.to_thread(self.partition.bring_up, node_layout, f"{app.name}: load")
                if deferred:
                    await self._release_mig(f"{app.name}: load refused")
                    raise JigsawError(f"its plan needs {len(deferred)} MIG slots that other apps hold or "
                                      "drain")
                node_layout = self.partition.with_uuids(node_layout)
            gen = self._lay_out(app, plan)
            try:
                await self._launch(gen, node_layout, router)
            except Exception as exc:
                await self._abandon(gen)
                await self._release_mig(f"{app.name}: generation {gen.gid} failed")
                raise JigsawError(f"its workers did not start ({exc})") from None
            router.route(app.name, gen.gid)
            self.current[app.name] = gen.gid
            self.node_layout = node_layout
        self.log(f"{app.name}: loaded on generation {gen.gid} ({len(gen.topology.processes)} processes)")
