"""The MPS control daemons of the node: one per MIG instance of MPS level k > 1 or whose processes of
different tasks share it (``jigsaw.shares``), or per whole GPU whose processes share it
(``gpu/mps.py`` ``WholeGpus``), started before its processes and stopped
once no live process runs on it; counted and logged for ``/metrics`` and ``/admin/layout``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from jigsaw.errors import JigsawError
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.gpu.mps import MpsManager, WholeGpus
from jigsaw.mig import share_level
from jigsaw.runtime.generation import Generation


class MpsDaemons:
    """The node's MPS daemons (``manager``; None on a node without MIG). Started and stopped from
    threads (a re-plan's, a retirement's): one at a time, or two stop the same daemon."""

    def __init__(self, manager: MpsManager | None, log: Callable[[str], None],
                 gpus: WholeGpus | None = None) -> None:
        self.manager = manager
        self.log = log
        self.gpus = gpus  # a node using its GPUs whole: one daemon per GPU
        self._lock = threading.Lock()
        self.started_total = 0
        self.stopped_total = 0
        self.failures_total = 0
        self.events: list[dict[str, Any]] = []

    @staticmethod
    def slots(g: Generation, ks: Iterable[int]) -> set[tuple[int, int]]:
        """(GPU, start) of the processes of ``ks`` that run under an MPS daemon: MPS level k > 1,
        or one MPS share of a whole GPU or of a MIG instance (``jigsaw.shares``)."""
        procs = g.topology.processes
        return {w for k in ks if (procs[k].mps > 1 or share_level(procs[k].mig_profile))
                and (w := g.placement(k)) is not None}

    def _daemon_slot(self, slot: tuple[int, int]) -> tuple[int, int]:
        """The (GPU, start) of the daemon a process at ``slot`` connects to: on whole GPUs the
        GPU's one daemon (its shares' processes share it), else the MIG instance's own."""
        return (slot[0], 0) if self.gpus is not None and self.gpus.has(slot[0]) else slot

    def start(self, g: Generation, layout: NodeLayout | None) -> dict[tuple[int, int], dict[str, str]]:
        """Start the MPS daemons of ``g``'s new instances (before their processes); their clients'
        environment per (GPU, start). A failure stops the ones this call started and raises."""
        if layout is None and self.gpus is not None:
            layout = self.gpus.layout()  # a node using its GPUs whole: one daemon per GPU
        if self.manager is None or layout is None:
            return {}
        with self._lock:
            return self._start_locked(g, layout)

    def _start_locked(self, g: Generation, layout: NodeLayout) -> dict[tuple[int, int], dict[str, str]]:
        mps = self.manager
        assert mps is not None
        at = {(i.gpu, i.start): i for i in layout.instances}
        if self.gpus is not None:  # a GPU used whole: its one daemon, keyed (GPU, 0)
            at.update({(i.gpu, i.start): i for i in self.gpus.layout().instances})
        started = []
        env: dict[tuple[int, int], dict[str, str]] = {}
        try:
            for slot in sorted(self.slots(g, g.own())):
                inst = at.get(self._daemon_slot(slot))
                if inst is None:
                    continue
                if inst.device_slot not in mps.daemons:
                    mps.start(inst)
                    started.append(inst)
                    self.started_total += 1
                    self.events.append({"at": time.time(), "event": "mps_start", "instance": inst.name})
                env[slot] = mps.client_env(inst)
        except JigsawError as exc:
            self.failures_total += 1
            for inst in started:
                with contextlib.suppress(JigsawError):
                    mps.stop(inst)
            raise JigsawError(f"MPS: {exc}") from None
        return env

    def stop_unused(self, generations: Iterable[Generation]) -> None:
        """Stop the daemons no live process runs on any more (after their processes stopped)."""
        if self.manager is None:
            return
        with self._lock:
            used: set[tuple[int, int]] = set()
            for g in generations:
                live = [k for k in range(len(g.topology.processes)) if k not in g.handed_over]
                used |= {self._daemon_slot(w) for w in self.slots(g, live)}
            self._stop_all_but(used)

    def _stop_all_but(self, used: set[tuple[int, int]]) -> None:
        mps = self.manager
        assert mps is not None
        for slot, daemon in list(mps.daemons.items()):
            if slot[:2] in used:
                continue
            inst = NodeInstance(gpu=slot[0], profile=slot[2], start=slot[1])
            try:
                mps.stop(inst)
                self.stopped_total += 1
                self.events.append({"at": time.time(), "event": "mps_stop",
                                    "directory": str(daemon.directory)})
            except JigsawError as exc:
                self.failures_total += 1
                self.log(f"MPS daemon of GPU {slot[0]} start {slot[1]} did not stop: {exc}")

    def close(self) -> None:
        """Stop every daemon (after every process that used them)."""
        if self.manager is not None:
            for why in self.manager.stop_all():
                self.log(f"MPS daemon did not stop: {why}")
