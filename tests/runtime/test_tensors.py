"""Tensor codec: round trips for every OIP datatype, zero-copy views, corrupt payloads rejected."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jigsaw.tensors import DATATYPES, Tensor, datatype_of, decode_tensors, encode_tensors


def _sample(datatype: str, shape: tuple[int, ...], rng: np.random.Generator):
    if datatype == "BYTES":
        n = int(np.prod(shape))
        return np.array([rng.bytes(int(rng.integers(0, 20))) for _ in range(n)], dtype=object).reshape(shape)
    dtype = DATATYPES[datatype]
    raw = rng.bytes(int(np.prod(shape)) * dtype.itemsize)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return arr.astype(bool) if datatype == "BOOL" else arr


@pytest.mark.parametrize("datatype", list(DATATYPES))
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (1, 0, 4), (2, 2, 2, 3)])
def test_round_trip_every_datatype(datatype, shape):
    rng = np.random.default_rng(len(shape) * 31 + len(datatype))
    data = _sample(datatype, shape, rng)
    second = ("second", "FP32", None, np.ones(2, "f4"))
    payload = encode_tensors([Tensor("in", datatype, shape, data), second])
    first, second = decode_tensors(bytes(payload))
    assert (first.name, first.datatype, first.shape) == ("in", datatype, shape)
    assert first.data.shape == shape
    if datatype == "BYTES":
        assert first.data.tolist() == data.tolist()
    else:
        assert first.data.tobytes() == np.ascontiguousarray(data).tobytes()
    assert second.name == "second" and second.data.tolist() == [1.0, 1.0]


def test_decode_is_zero_copy():
    payload = encode_tensors([("x", "INT64", (4,), np.arange(4, dtype="<i8"))])
    (t,) = decode_tensors(payload)
    assert np.shares_memory(t.data, np.frombuffer(payload, dtype="u1"))
    payload[-8:] = (99).to_bytes(8, "little")
    assert t.data[-1] == 99
    (ro,) = decode_tensors(bytes(payload))
    assert not ro.data.flags.writeable


def test_inputs_are_normalised_and_checked():
    big_endian = np.arange(6, dtype=">f4").reshape(2, 3)
    (t,) = decode_tensors(encode_tensors([("x", "FP32", (2, 3), big_endian)]))
    assert t.data.tolist() == big_endian.tolist()
    (s,) = decode_tensors(encode_tensors([("s", "BYTES", (2,), ["héllo", b"\x00"])]))
    assert s.data.tolist() == ["héllo".encode(), b"\x00"]
    raw = encode_tensors([("r", "UINT16", (2,), b"\x01\x00\x02\x00")])
    assert decode_tensors(raw)[0].data.tolist() == [1, 2]
    with pytest.raises(ValueError, match="does not match"):
        encode_tensors([("x", "FP32", (3,), np.zeros(3, "f8"))])
    with pytest.raises(ValueError, match="does not match"):
        encode_tensors([("x", "FP32", (4,), np.zeros(3, "f4"))])
    with pytest.raises(ValueError, match="expected 12"):
        encode_tensors([("x", "FP32", (3,), bytes(10))])
    with pytest.raises(ValueError, match="unknown datatype"):
        encode_tensors([("x", "FP128", (1,), bytes(16))])
    with pytest.raises(ValueError, match="BYTES elements"):
        encode_tensors([("x", "BYTES", (3,), [b"a"])])
    with pytest.raises(ValueError):
        encode_tensors([("x", "BYTES", (1,), b"\x05\x00\x00\x00ab")])


def test_datatype_of():
    assert datatype_of(np.float32) == "FP32"
    assert datatype_of(np.dtype(">i8")) == "INT64"
    assert datatype_of(np.bool_) == "BOOL"
    assert datatype_of(object) == "BYTES"
    with pytest.raises(ValueError):
        datatype_of(np.complex64)


def _reference_payload() -> bytes:
    rng = np.random.default_rng(0)
    return bytes(encode_tensors([
        ("img", "UINT8", (2, 3), _sample("UINT8", (2, 3), rng)),
        ("txt", "BYTES", (2,), [b"ab", b"cde"]),
        ("score", "FP64", (1,), np.array([0.5])),
    ]))


def test_every_truncation_is_rejected():
    payload = _reference_payload()
    for n in range(len(payload)):
        with pytest.raises(ValueError):
            decode_tensors(payload[:n])
    with pytest.raises(ValueError, match="end at"):
        decode_tensors(payload + bytes(8))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corruption_raises_value_error_or_decodes(data):
    payload = bytearray(_reference_payload())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    try:
        tensors = decode_tensors(bytes(payload))
    except ValueError:
        return
    for t in tensors:
        assert t.datatype in DATATYPES and t.data.shape == t.shape
