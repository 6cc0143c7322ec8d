"""Binary codec for named tensors carried as one ring payload: no pickle, zero-copy decode.

Format (little endian; every section starts at a multiple of 8 from the payload's start)::

    payload  := preamble tensor*
    preamble := u32 magic "JTNS" | u16 version (1) | u16 num_tensors
    tensor   := u16 name_len | u8 dtype_code | u8 ndim | u32 reserved (0) | u64 data_bytes
                | u64 shape[ndim] | name (UTF-8) | pad to 8 | data | pad to 8

Datatypes are the Open Inference Protocol's (``UINT8``, ``FP32``, ``BYTES``, ...). Fixed-width data
is raw little-endian, row-major; ``BF16`` decodes to its raw ``uint16`` bits (numpy has no
bfloat16). ``BYTES`` data is each element as u32 length + bytes, as Triton and KServe send it.
Decoding returns numpy views into the payload (read-only when it is) (``BYTES``: an object array of ``bytes``,
necessarily a copy); every length is checked, so a corrupt payload raises ValueError.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DATATYPES", "Tensor", "datatype_of", "decode_tensors", "encode_tensors"]

MAGIC = int.from_bytes(b"JTNS", "little")
VERSION = 1
MAX_NDIM = 32

DATATYPES: dict[str, np.dtype | None] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": None,
}
"""OIP datatype -> little-endian numpy dtype of its wire form (None for BYTES)."""

_CODE_OF = {name: code for code, name in enumerate(DATATYPES, start=1)}
_NAME_OF = {code: name for name, code in _CODE_OF.items()}
_PREAMBLE = struct.Struct("<IHH")
_TENSOR = struct.Struct("<HBBIQ")
_U32 = struct.Struct("<I")
_MAX_U32 = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor; ``data`` has ``shape`` (an object array of bytes for BYTES)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


def datatype_of(dtype: np.dtype | type) -> str:
    """OIP datatype for a numpy dtype (str/bytes/object map to BYTES)."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    for name, wire in DATATYPES.items():
        if wire is not None and name != "BF16" and wire.newbyteorder("=") == dt.newbyteorder("="):
            return name
    raise ValueError(f"numpy dtype {dt} has no Open Inference Protocol datatype")


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _bytes_elements(data: Any) -> list[bytes]:
    flat = data.ravel().tolist() if isinstance(data, np.ndarray) else list(data)
    out = []
    for x in flat:
        b = x.encode() if isinstance(x, str) else bytes(x)
        if len(b) > _MAX_U32:
            raise ValueError("a BYTES element is longer than 4 GiB")
        out.append(b)
    return out


def _check_bytes_wire(mv: memoryview, count: int) -> list[bytes]:
    """Split length-prefixed BYTES data into exactly ``count`` elements, or raise ValueError."""
    out = []
    pos, end = 0, len(mv)
    for _ in range(count):
        if end - pos < 4:
            raise ValueError("truncated BYTES tensor: missing element length")
        (n,) = _U32.unpack_from(mv, pos)
        pos += 4
        if n > end - pos:
            raise ValueError(f"truncated BYTES tensor: element of {n} bytes overruns the data")
        out.append(bytes(mv[pos:pos + n]))
        pos += n
    if pos != end:
        raise ValueError(f"BYTES tensor has {end - pos} trailing bytes after {count} elements")
    return out


def _prepare(t: Any) -> tuple[bytes, int, tuple[int, ...], Any]:
    """Normalise one input to (name_utf8, dtype_code, shape, wire buffer)."""
    if isinstance(t, Tensor):
        name, datatype, shape, data = t.name, t.datatype, t.shape, t.data
    else:
        name, datatype, shape, data = t
    if datatype not in _CODE_OF:
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    name_b = name.encode()
    if len(name_b) > 0xFFFF:
        raise ValueError("tensor name longer than 65535 bytes")
    if shape is None:
        if not isinstance(data, np.ndarray):
            raise ValueError(f"tensor {name!r}: shape is required unless data is a numpy array")
        shape = data.shape
    shape = tuple(int(d) for d in shape)
    if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
        raise ValueError(f"tensor {name!r}: invalid shape {shape}")
    count = math.prod(shape)
    wire_dtype = DATATYPES[datatype]
    if wire_dtype is None:
        if isinstance(data, bytes | bytearray | memoryview):
            wire: Any = memoryview(data).cast("B")
            _check_bytes_wire(wire, count)
        else:
            elements = _bytes_elements(data)
            if len(elements) != count:
                raise ValueError(f"tensor {name!r}: {len(elements)} BYTES elements for shape {shape}")
            wire = b"".join(part for e in elements for part in (_U32.pack(len(e)), e))
    elif isinstance(data, np.ndarray):
        if datatype != "BF16" and data.dtype.newbyteorder("=") != wire_dtype.newbyteorder("="):
            raise ValueError(f"tensor {name!r}: numpy dtype {data.dtype} does not match {datatype}")
        if data.shape != shape:
            raise ValueError(f"tensor {name!r}: array shape {data.shape} does not match {shape}")
        wire = memoryview(np.ascontiguousarray(data, dtype=wire_dtype).reshape(-1).view(np.uint8))
    else:
        wire = memoryview(data).cast("B")
        if len(wire) != count * wire_dtype.itemsize:
            raise ValueError(f"tensor {name!r}: {len(wire)} data bytes for {datatype} shape {shape} "
                             f"(expected {count * wire_dtype.itemsize})")
    return name_b, _CODE_OF[datatype], shape, wire


_RAW_HEADS: dict[tuple[str, str, tuple[int, ...], int], bytes] = {}
"""(name, datatype, shape, data bytes) -> the encoded tensor up to its data, for ``_encode_raw``."""
_RAW_HEADS_MAX = 4096
_PADS = tuple(bytes(k) for k in range(8))


def _head(name_b: bytes, code: int, shape: tuple[int, ...], data_bytes: int) -> bytes:
    """A tensor's encoding up to its data: the fixed header, the shape, the name, padding to 8."""
    head_len = _TENSOR.size + 8 * len(shape) + len(name_b)
    return b"".join((_TENSOR.pack(len(name_b), code, len(shape), 0, data_bytes),
                     struct.pack(f"<{len(shape)}Q", *shape), name_b, _PADS[-head_len % 8]))


def _encode_raw(tensors: Sequence[Any]) -> bytearray | None:
    """``encode_tensors`` of ``Tensor``s whose data is raw ``bytes`` of a fixed-width type (what the
    workers' backends emit), from cached per-tensor heads: a checked head is the same bytes for the
    same name, type, shape and length, so only the first of each is built by ``_prepare``. None
    when any tensor is of another form."""
    if len(tensors) > 0xFFFF:
        return None
    parts: list[bytes] = [_PREAMBLE.pack(MAGIC, VERSION, len(tensors))]
    for t in tensors:
        if (type(t) is not Tensor or type(t.data) is not bytes or type(t.shape) is not tuple
                or t.datatype == "BYTES"):
            return None
        data = t.data
        key = (t.name, t.datatype, t.shape, len(data))
        head = _RAW_HEADS.get(key)
        if head is None:
            name_b, code, shape, wire = _prepare(t)  # raises on a bad name, type or length
            head = _head(name_b, code, shape, len(wire))
            if len(_RAW_HEADS) >= _RAW_HEADS_MAX:
                _RAW_HEADS.clear()
            _RAW_HEADS[key] = head
        parts += (head, data, _PADS[-len(data) % 8])
    return bytearray().join(parts)


def encode_tensors(tensors: Iterable[Tensor | tuple[str, str, Sequence[int] | None, Any]]) -> bytearray:
    """Serialise tensors (``Tensor`` or ``(name, datatype, shape, data)``) into one payload.

    ``data``: a numpy array of the matching dtype, raw little-endian bytes, or for BYTES a
    sequence/array of bytes or str (or already length-prefixed bytes).
    """
    tensors = tensors if isinstance(tensors, list | tuple) else list(tensors)
    fast = _encode_raw(tensors)
    if fast is not None:
        return fast
    prepared = [_prepare(t) for t in tensors]
    if len(prepared) > 0xFFFF:
        raise ValueError("at most 65535 tensors per payload")
    parts: list[Any] = [_PREAMBLE.pack(MAGIC, VERSION, len(prepared))]
    for name_b, code, shape, wire in prepared:
        parts += (_head(name_b, code, shape, len(wire)), wire, _PADS[-len(wire) % 8])
    return bytearray().join(parts)


def decode_tensors(payload: bytes | bytearray | memoryview) -> list[Tensor]:
    """Parse a payload from ``encode_tensors``; arrays are views into ``payload`` (keep it alive)."""
    mv = memoryview(payload).cast("B")
    end = len(mv)
    if end < _PREAMBLE.size:
        raise ValueError(f"tensor payload of {end} bytes is shorter than its preamble")
    magic, version, num_tensors = _PREAMBLE.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a jigsaw tensor payload v{VERSION} (magic={magic:#x}, version={version})")
    out = []
    pos = _PREAMBLE.size
    for i in range(num_tensors):
        if end - pos < _TENSOR.size:
            raise ValueError(f"truncated tensor payload: header of tensor {i} missing")
        name_len, code, ndim, reserved, data_bytes = _TENSOR.unpack_from(mv, pos)
        pos += _TENSOR.size
        datatype = _NAME_OF.get(code)
        if datatype is None or reserved != 0 or ndim > MAX_NDIM:
            raise ValueError(f"corrupt header of tensor {i} (dtype code {code}, ndim {ndim})")
        if end - pos < 8 * ndim + name_len:
            raise ValueError(f"truncated tensor payload: shape/name of tensor {i} missing")
        shape = struct.unpack_from(f"<{ndim}Q", mv, pos)
        pos += 8 * ndim
        name = bytes(mv[pos:pos + name_len]).decode()
        pos = _align8(pos + name_len)
        if pos > end or data_bytes > end - pos:
            raise ValueError(f"truncated tensor payload: data of tensor {name!r} overruns the payload")
        data_mv = mv[pos:pos + data_bytes]
        pos = _align8(pos + data_bytes)
        count = math.prod(shape)
        wire_dtype = DATATYPES[datatype]
        if wire_dtype is None:
            if 4 * count > data_bytes:
                raise ValueError(f"tensor {name!r}: {data_bytes} bytes cannot hold {count} BYTES elements")
            arr = np.empty(count, dtype=object)
            arr[:] = _check_bytes_wire(data_mv, count)
            arr = arr.reshape(shape)
        else:
            if count * wire_dtype.itemsize != data_bytes:
                raise ValueError(f"tensor {name!r}: {data_bytes} data bytes for {datatype} shape {shape}")
            arr = np.frombuffer(data_mv, dtype=wire_dtype, count=count).reshape(shape)
        out.append(Tensor(name, datatype, shape, arr))
    if pos != end:
        raise ValueError(f"tensor payload is {end} bytes but its tensors end at {pos}")
    return out
