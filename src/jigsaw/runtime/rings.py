"""Shared-memory transport between the data plane's processes: rings, doorbells, names, cleanup.

``ShmRing`` and ``RecordHeader`` come from the compiled ``jigsaw._core`` when it is built and
``JIGSAW_NO_EXTENSIONS`` is not ``1``, else from the byte-compatible pure-Python ``_pyring``.
The layout is documented on ``jigsaw.runtime._pyring.ShmRing``.

Consumer loop (one ``Doorbell`` per consumer, shared by all its input rings)::

    while running:
        got = [rec for ring in inputs for rec in ring.pop_many(64)]
        if not got:
            bell.wait(timeout_s)   # blocks in sem_timedwait: an idle consumer uses no CPU
        ...

A producer pushes, then ``ring()``s. No wakeup is lost: a ring that lands between the consumer's
empty check and its ``wait`` leaves the semaphore posted, so ``wait`` returns at once.
POSIX semaphores have no file descriptor; an asyncio layer waits on ``Doorbell.wait`` in a thread
(the call releases the GIL) and hands the wakeup to its loop.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import secrets
from pathlib import Path
from types import ModuleType

import posix_ipc

from jigsaw.runtime import _pyring
from jigsaw.runtime._pyring import (
    RECORD_OVERHEAD_BYTES,
    RingClosedError,
    RingCorruptError,
    default_max_payload_bytes,
)

__all__ = [
    "HAS_EXTENSION",
    "RECORD_OVERHEAD_BYTES",
    "Doorbell",
    "RecordHeader",
    "RingClosedError",
    "RingCorruptError",
    "SegmentRegistry",
    "ShmRing",
    "Status",
    "cleanup_stale",
    "default_max_payload_bytes",
    "load_core",
    "make_daemon_id",
    "segment_name",
]

SHM_DIR = Path("/dev/shm")
NAME_PREFIX = "jigsaw-"
_PURPOSE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")
_NAME_RE = re.compile(r"^(?:sem\.)?jigsaw-(\d+)-[0-9a-f]+-")


def load_core() -> ModuleType | None:
    """The compiled ``jigsaw._core`` module, or None when absent or disabled by JIGSAW_NO_EXTENSIONS=1."""
    if os.environ.get("JIGSAW_NO_EXTENSIONS") == "1":
        return None
    try:
        from jigsaw import _core
    except ImportError:
        return None
    return _core


_core = load_core()
HAS_EXTENSION = _core is not None
if _core is not None:
    ShmRing = _core.ShmRing
    RecordHeader = _core.RecordHeader
else:
    ShmRing = _pyring.ShmRing  # type: ignore[misc]
    RecordHeader = _pyring.RecordHeader  # type: ignore[misc]


class Status(enum.IntEnum):
    """Outcome carried in a record header's ``status``; every accepted request ends in exactly one."""

    OK = 0
    DROPPED_DEADLINE = 1  # == DropReason.DROP_DEADLINE
    DROPPED_STALE = 2  # == DropReason.DROP_STALE
    ERROR = 3
    REJECTED = 4  # refused at admission (queue full, unknown model)
    CANCELLED = 5


DROP_REASONS = {Status.DROPPED_DEADLINE: "deadline", Status.DROPPED_STALE: "stale",
                Status.REJECTED: "queue_full", Status.ERROR: "error", Status.CANCELLED: "cancelled"}
"""The ``reason`` a 504 and the dropped metric give for a record's status."""


def drop_reason(status: int) -> str:
    """The reason of a (possibly unknown) non-OK status."""
    return DROP_REASONS.get(status, "error")  # type: ignore[call-overload]


def make_daemon_id(pid: int | None = None) -> str:
    """``<pid>-<random hex>``: unique per daemon run, and names carry the pid for stale cleanup."""
    return f"{os.getpid() if pid is None else pid}-{secrets.token_hex(4)}"


def segment_name(daemon_id: str, purpose: str) -> str:
    """POSIX name ``/jigsaw-<daemon_id>-<purpose>`` for a ring or doorbell."""
    if not _PURPOSE_RE.match(purpose):
        raise ValueError(f"purpose {purpose!r} must be 1-120 characters of [A-Za-z0-9_.-]")
    return f"/{NAME_PREFIX}{daemon_id}-{purpose}"


class Doorbell:
    """A named POSIX semaphore a consumer sleeps on; producers ring it after pushing.

    Rings coalesce: a producer posts only when the count is 0, so a burst of pushes costs one
    wakeup and the count stays small. The creator owns the name (see ``SegmentRegistry``).
    """

    def __init__(self, sem: posix_ipc.Semaphore) -> None:
        self._sem = sem
        self.name: str = sem.name

    @classmethod
    def create(cls, name: str) -> Doorbell:
        """Create a new doorbell (fails if ``name`` exists), mode 0o600, initially not rung."""
        return cls(posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=0))

    @classmethod
    def attach(cls, name: str) -> Doorbell:
        return cls(posix_ipc.Semaphore(name))

    def ring(self) -> None:
        """Wake the consumer (cheap no-op when a wakeup is already pending)."""
        if self._sem.value == 0:
            self._sem.release()

    def wait(self, timeout_s: float | None) -> bool:
        """Block until rung or ``timeout_s`` passes (None: forever; 0: poll); True when rung."""
        try:
            self._sem.acquire(timeout_s)
        except posix_ipc.BusyError:
            return False
        return True

    def close(self) -> None:
        self._sem.close()

    def unlink(self) -> None:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore(self.name)

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Doorbell {self.name}>"


class SegmentRegistry:
    """Creates a daemon's rings and doorbells and remembers every name so ``cleanup()`` unlinks them.

    Names are kept in memory and appended to ``manifest_path`` (one ``shm <name>`` or ``sem <name>``
    line each, written before the object is created) so a supervisor can clean up after a crash
    even where the names do not follow the ``jigsaw-<pid>-`` convention.
    """

    def __init__(self, manifest_path: str | os.PathLike[str] | None = None,
                 daemon_id: str | None = None) -> None:
        self.daemon_id = daemon_id or make_daemon_id()
        self.manifest_path = Path(manifest_path) if manifest_path is not None else None
        self._entries: list[tuple[str, str]] = []

    def _record(self, kind: str, name: str) -> None:
        self._entries.append((kind, name))
        if self.manifest_path is not None:
            with open(self.manifest_path, "a", encoding="ascii") as f:
                f.write(f"{kind} {name}\n")

    def name(self, purpose: str) -> str:
        return segment_name(self.daemon_id, purpose)

    def create_ring(self, purpose: str, capacity_bytes: int, *, max_payload_bytes: int | None = None,
                    role: str | None = None) -> ShmRing:
        name = self.name(purpose)
        self._record("shm", name)
        return ShmRing.create(name, capacity_bytes, max_payload_bytes=max_payload_bytes, role=role)

    def create_doorbell(self, purpose: str) -> Doorbell:
        name = self.name(purpose)
        self._record("sem", name)
        return Doorbell.create(name)

    def add_shm(self, name: str) -> None:
        """Track a segment created elsewhere."""
        self._record("shm", name)

    def add_sem(self, name: str) -> None:
        self._record("sem", name)

    @property
    def names(self) -> list[str]:
        return [name for _, name in self._entries]

    def cleanup(self) -> list[str]:
        """Unlink every tracked name (missing ones are fine) and delete the manifest; returns the names."""
        done = [_unlink(kind, name) for kind, name in self._entries]
        self._entries.clear()
        if self.manifest_path is not None:
            self.manifest_path.unlink(missing_ok=True)
        return [name for name in done if name]

    @staticmethod
    def cleanup_manifest(manifest_path: str | os.PathLike[str]) -> list[str]:
        """Unlink everything listed in a manifest left by a dead daemon, then delete it."""
        path = Path(manifest_path)
        try:
            lines = path.read_text(encoding="ascii").splitlines()
        except FileNotFoundError:
            return []
        done = []
        for line in lines:
            kind, _, name = line.partition(" ")
            if kind in ("shm", "sem") and name and _unlink(kind, name):
                done.append(name)
        path.unlink(missing_ok=True)
        return done

    def __enter__(self) -> SegmentRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _unlink(kind: str, name: str) -> str | None:
    try:
        if kind == "shm":
            posix_ipc.unlink_shared_memory(name)
        else:
            posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        return None
    return name


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = NAME_PREFIX, *, shm_dir: str | os.PathLike[str] = SHM_DIR) -> list[str]:
    """Unlink ``jigsaw-<pid>-<token>-*`` segments and semaphores whose daemon pid is not alive.

    Semaphores appear in ``shm_dir`` as ``sem.<name>``. Conservative: a pid reused by another
    process keeps its leftovers until that process is gone too. Returns the POSIX names removed.
    """
    if not prefix.startswith(NAME_PREFIX):
        raise ValueError(f"prefix must start with {NAME_PREFIX!r}")
    removed = []
    try:
        entries = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    for entry in entries:
        is_sem = entry.startswith("sem.")
        bare = entry[4:] if is_sem else entry
        m = _NAME_RE.match(entry)
        if not bare.startswith(prefix) or m is None or _pid_alive(int(m.group(1))):
            continue
        name = _unlink("sem" if is_sem else "shm", "/" + bare)
        if name:
            removed.append(name)
    return removed
