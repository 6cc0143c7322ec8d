"""KServe v2 / Triton gRPC infer messages <-> jigsaw's parsed request and answer document.

``parse_grpc_request`` checks a ``ModelInferRequest`` against the app's inputs with the HTTP
parser's rules and messages (``inputs[0].shape: ...``), so both front ends refuse the same
requests with the same words; it reads typed ``contents`` or ``raw_input_contents`` (one entry
per input, Triton's rule: all raw or none; BYTES raw as 4-byte little-endian lengths + bytes),
and the system shared memory parameters. ``parameters.timeout`` (microseconds) and the call's
own gRPC deadline both bound the request's deadline, the sooner winning; ``priority`` as HTTP.
``encode_grpc_response`` writes the dispatcher's answer with ``raw_output_contents`` (what
Triton's server sends; an output written to shared memory has an empty entry).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from jigsaw.app import App
from jigsaw.runtime.oip import (
    BadRequest,
    InferRequest,
    _to_array,
    array_from_bytes,
    check_min_shape,
    request_timeout_us,
    shm_input,
    shm_output,
)
from jigsaw.runtime.shm_regions import SharedMemoryRegions
from jigsaw.tensors import DATATYPES

_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def param_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def params_dict(m: Any) -> dict[str, Any]:
    return {k: param_value(v) for k, v in m.items()}


def set_param(m: Any, key: str, value: Any) -> None:
    p = m[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def _bytes_tensor(f: str, raw: bytes, n: int) -> list[str]:
    out, at = [], 0
    try:
        for _ in range(n):
            (size,) = struct.unpack_from("<I", raw, at)
            at += 4
            if at + size > len(raw):
                raise BadRequest(f"{f}: BYTES element runs past the raw contents")
            out.append(raw[at : at + size].decode("utf-8"))
            at += size
    except struct.error:
        raise BadRequest(f"{f}: raw contents hold fewer than {n} BYTES elements") from None
    except UnicodeDecodeError:
        raise BadRequest(f"{f}: BYTES elements must be UTF-8 text") from None
    if at != len(raw):
        raise BadRequest(f"{f}: {len(raw) - at} raw bytes past its {n} BYTES elements")
    return out


def _tensor(f: str, t: Any, raw: bytes | None, shm: SharedMemoryRegions | None, app: App) -> Any:
    dt, shape = t.datatype, list(t.shape)
    tparams = params_dict(t.parameters)
    if "shared_memory_region" in tparams:
        return shm_input(f, {"parameters": tparams}, dt, shape, shm)
    if raw is not None:
        dtype = DATATYPES[dt]
        if dtype is None:
            return _bytes_tensor(f, raw, math.prod(shape))
        want = math.prod(shape) * dtype.itemsize
        if len(raw) != want:
            raise BadRequest(
                f"raw_input_contents[{f[7:-1]}]: {len(raw)} bytes for {dt} shape {shape} (expected {want})"
            )
        return array_from_bytes(f, dt, shape, raw)
    field = _CONTENTS.get(dt)
    if field is None:
        raise BadRequest(f"{f}.contents: {dt} has no typed contents; send raw_input_contents")
    flat = list(getattr(t.contents, field))
    if dt == "BYTES":
        try:
            flat = [x.decode("utf-8") for x in flat]
        except UnicodeDecodeError:
            raise BadRequest(f"{f}.contents: BYTES elements must be UTF-8 text") from None
    if len(flat) != math.prod(shape):
        raise BadRequest(
            f"{f}.contents: {len(flat)} elements for shape {shape} (expected {math.prod(shape)})"
        )
    arr = _to_array(f"{f}.contents", dt, flat)
    return arr.reshape(shape) if isinstance(arr, np.ndarray) else arr


def parse_grpc_request(
    req: pb.ModelInferRequest,
    app: App,
    shm: SharedMemoryRegions | None,
    time_remaining_s: float | None = None,
) -> InferRequest:
    """Validate a ``ModelInferRequest`` against the app's inputs (the HTTP parser's rules)."""
    params = params_dict(req.parameters)
    raw = req.raw_input_contents
    if raw and len(raw) != len(req.inputs):
        raise BadRequest(
            f"raw_input_contents: {len(raw)} entries for {len(req.inputs)} inputs (give every "
            "input's bytes there, or none)"
        )
    if not req.inputs:
        raise BadRequest("inputs: expected a non-empty array of tensors")
    specs = {s.name: s for s in app.inputs}
    inputs, seen = [], set()
    for i, t in enumerate(req.inputs):
        f = f"inputs[{i}]"
        if t.name not in specs:
            raise BadRequest(
                f"{f}.name: unknown input {t.name!r} (model {app.name} takes {', '.join(specs)})"
            )
        if t.name in seen:
            raise BadRequest(f"{f}.name: input {t.name!r} given twice")
        seen.add(t.name)
        spec = specs[t.name]
        if t.datatype != spec.datatype:
            raise BadRequest(f"{f}.datatype: input {t.name!r} expects {spec.datatype}, got {t.datatype!r}")
        shape = list(t.shape)
        if (
            any(d < 0 for d in shape)
            or len(shape) != len(spec.shape)
            or any(s != -1 and s != d for s, d in zip(spec.shape, shape))
        ):
            raise BadRequest(
                f"{f}.shape: input {t.name!r} expects shape {list(spec.shape)} (-1: any), got {shape}"
            )
        check_min_shape(f, spec, shape)
        inputs.append((t.name, t.datatype, tuple(shape), _tensor(f, t, raw[i] if raw else None, shm, app)))
    missing = [n for n in specs if n not in seen]
    if missing:
        raise BadRequest(f"inputs: missing input {missing[0]!r}")
    outputs, shm_outputs = None, {}
    if req.outputs:
        outputs = [o.name for o in req.outputs]
        for i, o in enumerate(req.outputs):
            oparams = params_dict(o.parameters)
            if "shared_memory_region" in oparams:
                shm_outputs[o.name] = shm_output(i, oparams, shm)
    timeout_us = request_timeout_us(params)
    if time_remaining_s is not None:  # the call's gRPC deadline
        left_us = max(1, int(time_remaining_s * 1e6))
        timeout_us = left_us if timeout_us is None else min(timeout_us, left_us)
    return InferRequest(req.id or None, inputs, outputs, params, None, True, timeout_us, shm_outputs or None)


def _raw(arr: np.ndarray, datatype: str) -> bytes:
    wire = DATATYPES[datatype]
    if wire is None:  # BYTES: each element's length, then its bytes
        items = [x if isinstance(x, bytes) else str(x).encode() for x in np.asarray(arr).reshape(-1).tolist()]
        return b"".join(struct.pack("<I", len(x)) + x for x in items)
    return np.ascontiguousarray(arr.astype(wire, copy=False)).tobytes()


def encode_grpc_response(doc: dict[str, Any]) -> pb.ModelInferResponse:
    """The dispatcher's 200 document as a ``ModelInferResponse`` (raw output contents)."""
    resp = pb.ModelInferResponse(
        model_name=doc["model_name"], model_version=doc.get("model_version", "1"), id=doc.get("id") or ""
    )
    for k, v in doc.get("parameters", {}).items():
        set_param(resp.parameters, k, v)
    raws = []
    for out in doc.get("outputs", []):
        o = resp.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        for k, v in out.get("parameters", {}).items():
            set_param(o.parameters, k, v)
        raws.append(_raw(out["data"], out["datatype"]) if "data" in out else b"")
    resp.raw_output_contents.extend(raws)
    return resp
