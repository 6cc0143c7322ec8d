"""Triton's system shared memory extension: clients' POSIX regions registered by name.

A client creates a POSIX shared-memory object (``shm_open``; ``tritonclient.utils.shared_memory``
does), registers ``[offset, offset + byte_size)`` of it under a name
(``POST /v2/systemsharedmemory/region/{name}/register`` or gRPC), then names the region in an
input's or output's parameters (``shared_memory_region``, ``shared_memory_byte_size``,
optional ``shared_memory_offset`` within the region): the input is read from it, the output
written into it (the answer then carries no data, only those parameters).

Safe by default: a key is one name in the shm namespace (``/dev/shm``; no ``/`` inside it, no
``..``), never one of jigsaw's own segments (``jigsaw-*``, ``sem.*``); the object must belong to
the daemon's user and be accessible to no one else (mode ``0600``: what ``shm_open`` by
``tritonclient`` and ``multiprocessing.shared_memory`` create), so no other user can feed or read
another's tensors through the daemon. Every read and write is checked against the region's
bounds. A bad call raises ``ShmError``, whose message names what is wrong (a 400, or gRPC
INVALID_ARGUMENT; ``NOT_FOUND`` for an unknown region name).
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

import posix_ipc

_KEY = re.compile(r"/?[A-Za-z0-9_.\-]{1,240}")
_RESERVED = ("jigsaw-", "sem.")  # the daemon's own segments and semaphores
MAX_REGIONS = 1024


class ShmError(ValueError):
    """A refused shared-memory call or tensor; ``not_found``: the region name is unknown."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mm: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key.strip("/") in (".", ".."):
        raise ShmError(f"key: {key!r} is not a shared-memory name (letters, digits, '_', '.', '-', an "
                       "optional leading '/'; nothing outside the shm namespace)")
    bare = key.lstrip("/")
    if bare.startswith(_RESERVED):
        raise ShmError(f"key: {key!r} names one of the server's own segments")
    return "/" + bare


class SharedMemoryRegions:
    """The registered regions of one daemon (each mapped once, unmapped when unregistered)."""

    def __init__(self) -> None:
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise ShmError("name: a region needs a name")
        if name in self.regions:
            raise ShmError(f"shared memory region {name!r} is already registered")
        if len(self.regions) >= MAX_REGIONS:
            raise ShmError(f"at most {MAX_REGIONS} shared memory regions may be registered")
        for field, v in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ShmError(f"{field}: expected a non-negative byte count, got {v!r}")
        path = _check_key(key)
        try:
            shm = posix_ipc.SharedMemory(path, flags=0)
        except posix_ipc.ExistentialError:
            raise ShmError(f"key: no shared memory object {key!r}") from None
        except posix_ipc.PermissionsError:
            raise ShmError(f"key: shared memory object {key!r} is not readable and writable by the "
                           "server") from None
        try:
            st = os.fstat(shm.fd)
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ShmError(f"key: shared memory object {key!r} must belong to the server's user and be "
                               f"accessible to no one else (mode 0600; it has "
                               f"{stat.S_IMODE(st.st_mode):04o}, "
                               f"uid {st.st_uid})")
            if offset + byte_size > st.st_size or byte_size == 0:
                raise ShmError(f"byte_size: [{offset}, {offset + byte_size}) is not within the "
                               f"{st.st_size} bytes of {key!r}")
            mm = mmap.mmap(shm.fd, st.st_size)
        finally:
            shm.close_fd()
        self.regions[name] = Region(name, key, offset, byte_size, mm)

    def unregister(self, name: str | None = None) -> None:
        """Unregister ``name`` (every region when None or empty); an unknown name is no error (as Triton)."""
        names = list(self.regions) if not name else [name] if name in self.regions else []
        for n in names:
            self.regions.pop(n).mm.close()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        if name:
            return [self._region(name).status()]
        return [r.status() for r in self.regions.values()]

    def _region(self, name: str) -> Region:
        r = self.regions.get(name)
        if r is None:
            raise ShmError(f"unable to find system shared memory region {name!r}", not_found=True)
        return r

    def _span(self, field: str, name: Any, offset: Any, byte_size: Any) -> tuple[Region, int]:
        if not isinstance(name, str):
            raise ShmError(f"{field}.shared_memory_region: expected a region name")
        r = self._region(name)
        for what, v in (("shared_memory_offset", offset), ("shared_memory_byte_size", byte_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ShmError(f"{field}.{what}: expected a non-negative byte count, got {v!r}")
        if offset + byte_size > r.byte_size:
            raise ShmError(f"{field}: [{offset}, {offset + byte_size}) is not within region {name!r} "
                           f"of {r.byte_size} bytes")
        return r, r.offset + offset

    def read(self, field: str, params: dict[str, Any], want_bytes: int | None) -> bytes:
        """An input's bytes from its region (``params``: the tensor's parameters); ``want_bytes``:
        what its datatype and shape need (None: BYTES, any size)."""
        size = params.get("shared_memory_byte_size")
        r, start = self._span(field, params.get("shared_memory_region"),
                              params.get("shared_memory_offset", 0), size)
        if want_bytes is not None and size != want_bytes:
            raise ShmError(f"{field}.shared_memory_byte_size: {size} bytes, the tensor's datatype and "
                           f"shape need {want_bytes}")
        return r.mm[start:start + size]

    def target(self, field: str, params: dict[str, Any]) -> tuple[str, int, int]:
        """Where an output goes: (region, offset in it, byte size), checked now."""
        size = params.get("shared_memory_byte_size")
        offset = params.get("shared_memory_offset", 0)
        self._span(field, params.get("shared_memory_region"), offset, size)
        return params["shared_memory_region"], offset, size

    def write(self, name: str, offset: int, size: int, data: bytes | memoryview) -> None:
        r, start = self._span("output", name, offset, size)
        if len(data) > size:
            raise ShmError(f"output: {len(data)} bytes do not fit the {size} bytes given in region {name!r}")
        r.mm[start:start + len(data)] = data

    def close(self) -> None:
        self.unregister()
