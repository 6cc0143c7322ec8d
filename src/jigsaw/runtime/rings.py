"""Shared-memory transport between the data plane's processes: rings, doorbells, names, cleanup.

``ShmRing`` and ``RecordHeader`` come from the compiled ``jigsaw._core`` when it is built and
``JIGSAW_NO_EXTENSIONS`` is not ``1``, else from the byte-compatible pure-Python ``_pyring``.
The layout is documented on ``jigsaw.runtime._pyring.ShmRing``.

Blocking consumer loop (one ``Doorbell`` per consumer, shared by all its input rings)::

    while running:
        got = [rec for ring in inputs for rec in ring.pop_many(64)]
        if not got:
            bell.wait(timeout_s)   # blocks in poll() on the bell's descriptor: an idle consumer uses no CPU
        ...

A producer pushes, then ``ring()``s. No wakeup is lost: a ring that lands between the consumer's
empty check and its ``wait`` leaves the descriptor readable, so ``wait`` returns at once. An asyncio
consumer registers ``bell.fileno()`` with its loop instead (no helper thread) and follows the
arm / re-check protocol on ``Doorbell``, so producers skip the system call while it is awake.
"""

from __future__ import annotations

import contextlib
import enum
import math
import mmap
import os
import re
import secrets
import select
import struct
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import posix_ipc

from jigsaw.runtime import _pyring
from jigsaw.runtime._pyring import (
    RECORD_OVERHEAD_BYTES,
    Completion,
    RingClosedError,
    RingCorruptError,
    default_max_payload_bytes,
)

__all__ = [
    "BELL_FLAG_BYTES",
    "HAS_EXTENSION",
    "RECORD_OVERHEAD_BYTES",
    "Completion",
    "Doorbell",
    "RecordHeader",
    "RingClosedError",
    "RingCorruptError",
    "SegmentRegistry",
    "ShmRing",
    "Status",
    "cleanup_stale",
    "default_max_payload_bytes",
    "doorbell_kind",
    "load_core",
    "lone_child",
    "make_daemon_id",
    "push_child",
    "push_completion",
    "push_hop",
    "push_hops",
    "segment_name",
]

SHM_DIR = Path("/dev/shm")
NAME_PREFIX = "jigsaw-"
_PURPOSE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")
_NAME_RE = re.compile(r"^(?:sem\.)?jigsaw-(\d+)-[0-9a-f]+-")


# what the Python layers use of the compiled core (a test checks this list against the code)
CORE_NAMES = ("BatchQueue", "BellFlag", "RecordHeader", "ShmRing", "decode_arrays", "push_child",
              "push_completion", "push_hop", "push_hops", "lone_child")
_core_warned = False


def load_core() -> ModuleType | None:
    """The compiled ``jigsaw._core`` module, or None when absent, disabled by
    JIGSAW_NO_EXTENSIONS=1, or built from older sources than the Python code (then the pure
    fallbacks run and stderr says to rebuild: a stale build in a source checkout otherwise failed
    every request on its first missing function)."""
    global _core_warned
    if os.environ.get("JIGSAW_NO_EXTENSIONS") == "1":
        return None
    try:
        from jigsaw import _core
    except ImportError:
        return None
    missing = [n for n in CORE_NAMES if not hasattr(_core, n)]
    if missing:
        if not _core_warned:
            _core_warned = True
            print(f"jigsaw: the compiled core {_core.__file__} is older than the code (no "
                  f"{', '.join(missing)}): using the pure-Python fallbacks; rebuild it with "
                  "`python setup.py build_ext --inplace` (or reinstall)", file=sys.stderr, flush=True)
        return None
    return _core


_core = load_core()
HAS_EXTENSION = _core is not None
if _core is not None:
    ShmRing = _core.ShmRing
    RecordHeader = _core.RecordHeader
    push_child = _core.push_child
    push_completion = _core.push_completion
    push_hop = _core.push_hop
    push_hops = _core.push_hops
    lone_child = _core.lone_child
else:
    ShmRing = _pyring.ShmRing  # type: ignore[misc]
    RecordHeader = _pyring.RecordHeader  # type: ignore[misc]
    push_child = _pyring.push_child
    push_completion = _pyring.push_completion
    push_hop = _pyring.push_hop
    push_hops = _pyring.push_hops
    lone_child = _pyring.lone_child


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


class _PyBellFlag:
    """Pure-Python stand-in for ``jigsaw._core.BellFlag``: Python has no memory fence, so ``take``
    always says "signal" (a producer never skips a wake-up on a flag it may read stale)."""

    def __init__(self, buf: mmap.mmap) -> None:
        self._u32 = memoryview(buf)[:4].cast("I")

    def arm(self) -> None:
        self._u32[0] = 1
        with _FENCE:  # an uncontended lock is an atomic read-modify-write: a full barrier on x86
            pass

    def disarm(self) -> None:
        self._u32[0] = 0

    def take(self) -> bool:
        return True

    @property
    def armed(self) -> bool:
        return self._u32[0] != 0

    def release(self) -> None:
        self._u32.release()


_FENCE = threading.Lock()
_BellFlag = _core.BellFlag if _core is not None else _PyBellFlag
BELL_FLAG_BYTES = 64
FIFO_SUFFIX = ".fifo"
BELL_FIFO, BELL_EVENTFD = 0, 1  # a doorbell's kind, in its flag segment
_BELL_INFO = struct.Struct("<III")  # at byte 8 of the flag segment: kind, creator's pid, its eventfd
_BELL_INFO_AT = 8
_EVENTFD_ONE = (1).to_bytes(8, "little")
_HELD: dict[str, int] = {}  # doorbell name -> the eventfd this process created for it (open until unlinked)
_SYS_PIDFD_GETFD = 438  # the same number on every Linux architecture (since 5.6)
_eventfd_shareable: bool | None = None
_libc_syscall: Any = None


def _syscall() -> Any:
    """libc's ``syscall``, looked up once (so a forked child never runs the dynamic loader)."""
    global _libc_syscall
    if _libc_syscall is None:
        import ctypes

        _libc_syscall = ctypes.CDLL(None, use_errno=True).syscall
    return _libc_syscall


def _pidfd_getfd(pid: int, fd: int) -> int:
    """A duplicate of process ``pid``'s descriptor ``fd`` (``pidfd_getfd(2)``, close-on-exec)."""
    import ctypes

    syscall = _syscall()
    pidfd = os.pidfd_open(pid)
    try:
        got = syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(got)
    finally:
        os.close(pidfd)


def _probe_eventfd_sharing() -> bool:
    """Whether a child of this process may take one of its descriptors (``pidfd_getfd``): not where
    Yama's ptrace scope, a seccomp filter or an old kernel forbids it. A forked child tries once."""
    if not hasattr(os, "eventfd") or not hasattr(os, "pidfd_open"):
        return False
    try:
        _syscall()
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    except (OSError, AttributeError):
        return False
    try:
        pid = os.fork()
        if pid == 0:  # the child: only system calls, then _exit
            code = 1
            try:
                got = _pidfd_getfd(os.getppid(), efd)
                os.write(got, _EVENTFD_ONE)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return False
        return os.read(efd, 8) == _EVENTFD_ONE
    except OSError:
        return False
    finally:
        os.close(efd)


def doorbell_kind() -> int:
    """What ``Doorbell.create`` makes: ``JIGSAW_DOORBELL`` = ``fifo`` or ``eventfd``; by default
    (``auto``) an eventfd where other processes can take it (probed once), else a FIFO."""
    global _eventfd_shareable
    want = os.environ.get("JIGSAW_DOORBELL", "auto")
    if want == "fifo":
        return BELL_FIFO
    if _eventfd_shareable is None:
        _eventfd_shareable = _probe_eventfd_sharing()
        if not _eventfd_shareable and want == "auto":
            print("jigsaw: doorbells are FIFOs: this machine does not let a child process take its parent's "
                  "eventfd (pidfd_getfd: Yama ptrace scope, seccomp or kernel < 5.6)",
                  file=sys.stderr, flush=True)
    if want == "eventfd" and not _eventfd_shareable:
        raise RuntimeError("JIGSAW_DOORBELL=eventfd, but other processes cannot take this process's "
                           "descriptors (pidfd_getfd refused: Yama ptrace scope, seccomp or kernel < 5.6)")
    return BELL_EVENTFD if _eventfd_shareable else BELL_FIFO


def fifo_path(name: str) -> Path:
    """Where the doorbell ``name``'s FIFO lives (beside its flag segment in /dev/shm)."""
    return SHM_DIR / (name.lstrip("/") + FIFO_SUFFIX)


class Doorbell:
    """A consumer's wake-up: a descriptor its event loop watches, and a "may be asleep" flag.

    Two kinds, both attached by name as rings are (a worker restarted by the supervisor, kept
    across re-plans or started as a spare needs no inherited descriptor):

    * an **eventfd** (the default where other processes may take it, ``doorbell_kind``): the
      creator (the daemon) keeps it open; the flag segment names the creator's pid and the
      descriptor, and ``attach`` takes a duplicate (``pidfd_getfd(2)``). A write to an eventfd
      is a counter update and a wake-up, no pipe buffer;
    * a named **FIFO** ``<name>.fifo`` beside the flag segment in /dev/shm, which every process
      opens read-write and non-blocking (a write never blocks nor fails for want of a reader).

    Protocol (the flag is 1 while the consumer may sleep, 0 while it is awake or a wake-up waits):

    * producer: push, then ``ring()``: a full fence, and only if the flag is set, clear it and
      write to the descriptor (a busy consumer costs its producers no system call);
    * asyncio consumer: ``fileno()`` registered with ``loop.add_reader``; on readable, drain every
      ready record (the flag stays 0: awake, so no producer writes meanwhile); when out of work,
      ``clear()`` (read the wake-up: after the work, so the system call is off the woken path, and
      before the arm, so no new ring's wake-up is read), ``arm()`` (flag 1, full fence), look at the
      rings once more and, if a record is there, ``disarm()`` and drain again, else return to the
      loop (a callback that returns without arming clears too: a readable descriptor calls it again);
    * blocking consumer: ``wait(timeout_s)`` polls the descriptor and re-arms after reading, so the
      simple loop "pop; if nothing, wait" never misses a ring.

    The fences make the handshake a Dekker pair (the compiled ``BellFlag``); the pure fallback
    cannot fence its loads, so its producers always signal. A ring coalesces with a pending one.
    The creator owns the names (see ``SegmentRegistry``).
    """

    def __init__(self, name: str, fd: int, mm: mmap.mmap, kind: int = BELL_FIFO) -> None:
        self.name = name
        self.kind = kind
        self._fd = fd
        self._mm = mm
        self._flag = _BellFlag(mm)
        self._signal = _EVENTFD_ONE if kind == BELL_EVENTFD else b"\x01"
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    @classmethod
    def create(cls, name: str, kind: int | None = None) -> Doorbell:
        """Create a new doorbell (fails if ``name`` exists), mode 0o600, armed and not rung; an
        eventfd or a FIFO as ``doorbell_kind`` says unless ``kind`` is given."""
        kind = doorbell_kind() if kind is None else kind
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=BELL_FLAG_BYTES)
        try:
            mm = mmap.mmap(shm.fd, BELL_FLAG_BYTES)
        finally:
            shm.close_fd()
        struct.pack_into("<I", mm, 0, 1)
        try:
            if kind == BELL_EVENTFD:
                held = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                _HELD[name] = held
                _BELL_INFO.pack_into(mm, _BELL_INFO_AT, BELL_EVENTFD, os.getpid(), held)
                fd = os.dup(held)
            else:
                os.mkfifo(fifo_path(name), 0o600)
                fd = os.open(fifo_path(name), os.O_RDWR | os.O_NONBLOCK)
        except BaseException:
            mm.close()
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory(name)
            held = _HELD.pop(name, None)
            if held is not None:
                os.close(held)
            raise
        return cls(name, fd, mm, kind)

    @classmethod
    def attach(cls, name: str) -> Doorbell:
        shm = posix_ipc.SharedMemory(name)
        try:
            if shm.size < BELL_FLAG_BYTES:
                raise RingCorruptError(f"{name}: segment of {shm.size} bytes is not a doorbell")
            mm = mmap.mmap(shm.fd, BELL_FLAG_BYTES)
        finally:
            shm.close_fd()
        kind, pid, held = _BELL_INFO.unpack_from(mm, _BELL_INFO_AT)
        try:
            if kind == BELL_EVENTFD:
                fd = _take_eventfd(name, pid, held)
            else:
                fd = os.open(fifo_path(name), os.O_RDWR | os.O_NONBLOCK)
        except FileNotFoundError:
            mm.close()
            raise posix_ipc.ExistentialError(f"doorbell {name} has no FIFO {fifo_path(name)}") from None
        except BaseException:
            mm.close()
            raise
        return cls(name, fd, mm, kind)

    def fileno(self) -> int:
        """The descriptor: readable while a wake-up is pending (for ``loop.add_reader``)."""
        return self._fd

    def ring(self) -> None:
        """Wake the consumer if it may be asleep (no system call while it is awake or already rung)."""
        if self._flag.take():
            try:  # noqa: SIM105 (``contextlib.suppress`` builds an object on every wake-up's path)
                os.write(self._fd, self._signal)
            except BlockingIOError:  # full: a wake-up is pending anyway
                pass

    def arm(self) -> None:
        """The consumer is about to sleep: producers must signal; look at the rings once more after it."""
        self._flag.arm()

    def disarm(self) -> None:
        """The consumer is awake and will look at its rings again: producers need not signal."""
        self._flag.disarm()

    def clear(self) -> bool:
        """Read every pending wake-up (the flag is left as is); True when there was one."""
        if self.kind == BELL_EVENTFD:
            try:
                return bool(os.read(self._fd, 8))  # the counter, reset in one read
            except BlockingIOError:
                return False
        got = False
        while True:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                return got
            got = got or bool(data)
            if len(data) < 4096:
                return got

    def wait(self, timeout_s: float | None) -> bool:
        """Block until rung or ``timeout_s`` passes (None: forever; 0: poll); True when rung."""
        timeout_ms = -1 if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
        if not self._poll.poll(timeout_ms):
            return False
        got = self.clear()
        self._flag.arm()
        return got

    def close(self) -> None:
        if self._mm is None:
            return
        self._flag.release()
        os.close(self._fd)
        self._mm.close()
        self._mm = None

    def unlink(self) -> None:
        _unlink("bell", self.name)

    def __enter__(self) -> Doorbell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Doorbell {self.name}>"


def _take_eventfd(name: str, pid: int, held: int) -> int:
    """This process's descriptor for doorbell ``name``'s eventfd, held by process ``pid`` as ``held``."""
    mine = _HELD.get(name)
    if mine is not None and pid == os.getpid():
        return os.dup(mine)
    try:
        fd = _pidfd_getfd(pid, held)
    except OSError as exc:
        raise posix_ipc.ExistentialError(f"doorbell {name}: cannot take eventfd {held} of process {pid} "
                                         f"({exc.strerror}); JIGSAW_DOORBELL=fifo makes FIFO doorbells"
                                         ) from None
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        target = ""
    if target != "anon_inode:[eventfd]":  # the creator is gone and its pid reused
        os.close(fd)
        raise posix_ipc.ExistentialError(f"doorbell {name}: descriptor {held} of process {pid} is not its "
                                         "eventfd (its creator has exited)")
    return fd


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
        self._record("bell", name)
        return Doorbell.create(name)

    def add_shm(self, name: str) -> None:
        """Track a segment created elsewhere."""
        self._record("shm", name)

    def add_bell(self, name: str) -> None:
        """Track a doorbell created elsewhere (its flag segment and its FIFO)."""
        self._record("bell", name)

    add_sem = add_bell  # the name from when doorbells were semaphores

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
            if kind in ("shm", "sem", "bell") and name and _unlink(kind, name):
                done.append(name)
        path.unlink(missing_ok=True)
        return done

    def __enter__(self) -> SegmentRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _unlink(kind: str, name: str) -> str | None:
    """Unlink a ring (``shm``) or a doorbell (``bell``: flag segment and FIFO; ``sem``: a doorbell
    of a manifest written when doorbells were semaphores); the name when something was removed."""
    if kind == "shm":
        try:
            posix_ipc.unlink_shared_memory(name)
        except posix_ipc.ExistentialError:
            return None
        return name
    removed = False
    held = _HELD.pop(name, None)
    if held is not None:  # an eventfd doorbell this process created: its last holder goes
        os.close(held)
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)
        removed = True
    with contextlib.suppress(FileNotFoundError):
        fifo_path(name).unlink()
        removed = True
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_semaphore(name)
        removed = True
    return name if removed else None


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

    A doorbell is ``<name>`` (its flag) and ``<name>.fifo`` there, reported once; ``sem.<name>``
    entries are semaphores of older versions. Conservative: a pid reused by another
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
        if bare.endswith(FIFO_SUFFIX):
            name = _unlink("bell", "/" + bare[:-len(FIFO_SUFFIX)])
        else:
            name = _unlink("bell" if is_sem else "shm", "/" + bare)
        if name and name not in removed:
            removed.append(name)
    return removed
