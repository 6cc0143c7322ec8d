"""The Open Inference Protocol (KServe v2) REST body: validating requests, building responses.

Pure functions over parsed JSON, so the frontend stays thin and the rules are testable alone.
A bad request raises ``BadRequest`` whose message names the offending field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from jigsaw.app import App
from jigsaw.runtime.tensors import DATATYPES

_INT_RANGES = {dt: np.iinfo(DATATYPES[dt]) for dt in  # type: ignore[arg-type]
               ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")}


class BadRequest(ValueError):
    """A 400: the message names the field (``inputs[0].shape: ...``)."""


@dataclass
class InferRequest:
    id: str | None
    inputs: list[tuple[str, str, tuple[int, ...], Any]]  # (name, datatype, shape, array or list)
    outputs: list[str] | None  # requested output names, None: all
    parameters: dict[str, Any]


def _flatten(data: Any, out: list[Any]) -> None:
    for x in data:
        if isinstance(x, list):
            _flatten(x, out)
        else:
            out.append(x)


def _to_array(field: str, datatype: str, flat: list[Any]) -> Any:
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise BadRequest(f"{field}: BYTES data must be strings")
        return flat
    if datatype != "BOOL" and bool in set(map(type, flat)):  # numpy would read them as 1 and 0
        raise BadRequest(f"{field}: {datatype} data must be numbers, got true/false")
    try:
        arr = np.asarray(flat)
    except (ValueError, TypeError, OverflowError):
        raise BadRequest(f"{field}: data must be {datatype} numbers") from None
    if arr.size == 0:
        return arr.astype(DATATYPES[datatype])
    kind = arr.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise BadRequest(f"{field}: BOOL data must be true/false")
        return arr
    if kind not in "biuf":
        raise BadRequest(f"{field}: data must be {datatype} numbers, got non-numeric values")
    if datatype in _INT_RANGES:
        if kind == "f":
            raise BadRequest(f"{field}: {datatype} data must be integers")
        info = _INT_RANGES[datatype]
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise BadRequest(f"{field}: values out of range for {datatype}")
    if datatype == "BF16":
        raise BadRequest(f"{field}: BF16 over JSON is not supported; send FP32")
    return arr.astype(DATATYPES[datatype])


def _reject_constant(token: str) -> None:
    """NaN and Infinity are not JSON; Python's parser would accept them."""
    raise BadRequest(f"body: {token} is not valid JSON (send finite numbers)")


def parse_infer_request(body: bytes, app: App) -> InferRequest:
    """Validate a ``POST /v2/models/{app}/infer`` body against the app's declared inputs."""
    try:
        doc = json.loads(body, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body: not valid JSON ({exc})") from None
    except RecursionError:
        raise BadRequest("body: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("body: expected a JSON object")
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("id: expected a string")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest("parameters: expected an object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("inputs: expected a non-empty array of tensors")
    specs = {s.name: s for s in app.inputs}
    seen: set[str] = set()
    inputs = []
    for i, t in enumerate(raw_inputs):
        f = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"{f}: expected an object with name, shape, datatype, data")
        name = t.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"{f}.name: expected a string")
        if name not in specs:
            raise BadRequest(f"{f}.name: unknown input {name!r} (model {app.name} takes "
                             f"{', '.join(specs)})")
        if name in seen:
            raise BadRequest(f"{f}.name: input {name!r} given twice")
        seen.add(name)
        spec = specs[name]
        dt = t.get("datatype")
        if dt != spec.datatype:
            raise BadRequest(f"{f}.datatype: input {name!r} expects {spec.datatype}, got {dt!r}")
        shape = t.get("shape")
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise BadRequest(f"{f}.shape: expected an array of non-negative integers")
        if len(shape) != len(spec.shape) or any(s != -1 and s != d for s, d in zip(spec.shape, shape)):
            raise BadRequest(f"{f}.shape: input {name!r} expects shape {list(spec.shape)} "
                             f"(-1: any), got {shape}")
        if "data" not in t:
            raise BadRequest(f"{f}.data: missing (binary tensor data is not supported)")
        data = t["data"]
        if not isinstance(data, list):
            raise BadRequest(f"{f}.data: expected an array")
        flat: list[Any] = []
        _flatten(data, flat)
        if len(flat) != math.prod(shape):
            raise BadRequest(f"{f}.data: {len(flat)} elements for shape {shape} "
                             f"(expected {math.prod(shape)})")
        arr = _to_array(f"{f}.data", dt, flat)
        if isinstance(arr, np.ndarray):
            arr = arr.reshape(shape)  # OIP sends data flattened (row-major); the shape restores it
        inputs.append((name, dt, tuple(shape), arr))
    missing = [n for n in specs if n not in seen]
    if missing:
        raise BadRequest(f"inputs: missing input {missing[0]!r}")
    outputs = None
    if "outputs" in doc:
        raw = doc["outputs"]
        if not isinstance(raw, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                for o in raw):
            raise BadRequest("outputs: expected an array of objects with a name")
        outputs = [o["name"] for o in raw]
    return InferRequest(rid, inputs, outputs, params)
