"""The Open Inference Protocol (KServe v2) REST body: validating requests, building responses.

Pure functions over parsed JSON, so the frontend stays thin and the rules are testable alone.
A bad request raises ``BadRequest`` whose message names the offending field.

The binary tensor data extension (as Triton's) is supported: with an
``Inference-Header-Content-Length: N`` header the body is N bytes of JSON followed by the raw
little-endian, row-major bytes of every input whose ``parameters.binary_data_size`` is given, in
input order (BYTES tensors excepted). Outputs come back binary when asked
(``outputs[i].parameters.binary_data`` or the request's ``parameters.binary_data_output``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from jigsaw.app import App, TensorSpec
from jigsaw.runtime.shm_regions import SharedMemoryRegions, ShmError
from jigsaw.tensors import DATATYPES

_INT_RANGES = {dt: np.iinfo(DATATYPES[dt]) for dt in  # type: ignore[arg-type]
               ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64")}


class BadRequest(ValueError):
    """A 400: the message names the field (``inputs[0].shape: ...``)."""


HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class InferRequest:
    id: str | None
    inputs: list[tuple[str, str, tuple[int, ...], Any]]  # (name, datatype, shape, array or list)
    outputs: list[str] | None  # requested output names, None: all
    parameters: dict[str, Any]
    binary_outputs: set[str] | None = None  # outputs to send as binary data; None: every one
    all_binary: bool = False
    timeout_us: int | None = None  # ``parameters.timeout``: a deadline tighter than the SLO (wall us)
    shm_outputs: dict[str, tuple[str, int, int]] | None = None  # output -> (region, offset, byte size)


def header_length(value: str | None, body_bytes: int) -> int | None:
    """The JSON part's length from the extension's header (None without it)."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise BadRequest(f"{HEADER_LENGTH}: expected a byte count, got {value!r}") from None
    if not 0 < n <= body_bytes:
        raise BadRequest(f"{HEADER_LENGTH}: {n} is not within the body's {body_bytes} bytes")
    return n


def _binary_input(f: str, t: dict[str, Any], datatype: str, shape: list[int], binary: memoryview,
                  offset: int) -> tuple[np.ndarray, int]:
    size = t["parameters"]["binary_data_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"{f}.parameters.binary_data_size: expected a byte count")
    if "data" in t:
        raise BadRequest(f"{f}: give either data or parameters.binary_data_size, not both")
    dtype = DATATYPES[datatype]
    if dtype is None:
        raise BadRequest(f"{f}: binary BYTES tensors are not supported; send them as JSON strings")
    want = math.prod(shape) * dtype.itemsize
    if size != want:
        raise BadRequest(f"{f}.parameters.binary_data_size: {size} bytes for {datatype} shape {shape} "
                         f"(expected {want})")
    if offset + size > len(binary):
        raise BadRequest(f"{f}: the body holds {len(binary) - offset} binary bytes for it, not {size}")
    return array_from_bytes(f, datatype, shape, binary[offset:offset + size]), offset + size


def array_from_bytes(f: str, datatype: str, shape: list[int], raw: bytes | memoryview) -> np.ndarray:
    """A tensor from its raw little-endian bytes (their count already checked), values checked."""
    dtype = DATATYPES[datatype]
    assert dtype is not None
    arr = np.frombuffer(raw, dtype).reshape(shape)
    if datatype == "BOOL" and arr.size and int(arr.view(np.uint8).max()) > 1:
        raise BadRequest(f"{f}: BOOL bytes must be 0 or 1")
    if datatype in ("FP16", "FP32", "FP64") and arr.size and not np.isfinite(arr).all():
        raise BadRequest(f"{f}: data must be finite numbers")
    return arr.astype(dtype.newbyteorder("="), copy=True)


def shm_input(f: str, t: dict[str, Any], datatype: str, shape: list[int], shm: SharedMemoryRegions | None
               ) -> np.ndarray:
    """An input read from a registered system shared memory region (Triton's extension)."""
    if shm is None:
        raise BadRequest(f"{f}.parameters.shared_memory_region: shared memory is not served here")
    if "data" in t:
        raise BadRequest(f"{f}: give either data or parameters.shared_memory_region, not both")
    dtype = DATATYPES[datatype]
    if dtype is None:
        raise BadRequest(f"{f}: BYTES tensors from shared memory are not supported; send them as JSON "
                         "strings")
    try:
        raw = shm.read(f, t["parameters"], math.prod(shape) * dtype.itemsize)
    except ShmError as exc:
        raise BadRequest(str(exc)) from None
    return array_from_bytes(f, datatype, shape, raw)


def _flatten(data: Any, out: list[Any]) -> None:
    for x in data:
        if isinstance(x, list):
            _flatten(x, out)
        else:
            out.append(x)


SMALL_TENSOR = 64  # elements: below this, Python's min/max beat numpy's reductions


def _to_array(field: str, datatype: str, flat: list[Any]) -> Any:
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise BadRequest(f"{field}: BYTES data must be strings")
        return flat
    types = set(map(type, flat))
    if datatype != "BOOL" and bool in types:  # numpy would read them as 1 and 0
        raise BadRequest(f"{field}: {datatype} data must be numbers, got true/false")
    if types == {int} and datatype in _INT_RANGES and len(flat) <= SMALL_TENSOR:
        # the common small integer tensor: check the range in Python, one array made
        info = _INT_RANGES[datatype]
        if min(flat) < info.min or max(flat) > info.max:
            raise BadRequest(f"{field}: values out of range for {datatype}")
        return np.array(flat, DATATYPES[datatype])
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


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(text: bytes | memoryview) -> Any:
    """orjson (several times faster on OIP bodies); whatever it refuses (NaN, big integers, too
    deep, UTF-16, not JSON) goes through the standard parser, whose answer or error message is
    the one given: the same documents parse, and the 400s read as before."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raw = bytes(text)
        return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))


def check_min_shape(f: str, spec: TensorSpec, shape: list[int]) -> None:
    """A ``BadRequest`` when ``shape`` has an axis below the input's ``min_shape`` (an empty image
    to an image app): refused at the door, as both front ends do, before a model sees it."""
    if spec.min_shape and any(d < m for d, m in zip(shape, spec.min_shape)):
        raise BadRequest(f"{f}.shape: input {spec.name!r} needs at least {list(spec.min_shape)} per axis "
                         f"(the app's min_shape: the model cannot take an empty one), got {shape}")


def parse_infer_request(body: bytes, app: App, json_length: int | None = None,
                        shm: SharedMemoryRegions | None = None) -> InferRequest:
    """Validate a ``POST /v2/models/{app}/infer`` body against the app's declared inputs.

    ``json_length`` (from ``header_length``): the body is that much JSON, then binary tensor data.
    ``shm``: the registered system shared memory regions inputs and outputs may name.
    """
    binary = memoryview(body)[json_length:] if json_length is not None else memoryview(b"")
    offset = 0
    doc = _request_document(body, json_length)
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
        name, dt, shape = _input_header(f, t, app, specs, seen)
        tensor_params = t.get("parameters", {})
        if not isinstance(tensor_params, dict):
            raise BadRequest(f"{f}.parameters: expected an object")
        if "binary_data_size" in tensor_params:
            if json_length is None:
                raise BadRequest(f"{f}.parameters.binary_data_size: binary data needs the "
                                 f"{HEADER_LENGTH} header")
            arr, offset = _binary_input(f, t, dt, shape, binary, offset)
        elif "shared_memory_region" in tensor_params:
            arr = shm_input(f, t, dt, shape, shm)
        else:
            arr = _json_input(f, t, dt, shape)
        inputs.append((name, dt, tuple(shape), arr))
    missing = [n for n in specs if n not in seen]
    if missing:
        raise BadRequest(f"inputs: missing input {missing[0]!r}")
    if offset != len(binary):
        raise BadRequest(f"body: {len(binary) - offset} bytes of binary data belong to no input")
    outputs, binary_outputs, shm_outputs = _requested_outputs(doc, shm)
    all_binary = params.get("binary_data_output", False)
    if not isinstance(all_binary, bool):
        raise BadRequest("parameters.binary_data_output: expected true or false")
    timeout_us = request_timeout_us(params)
    return InferRequest(rid, inputs, outputs, params, binary_outputs, all_binary, timeout_us,
                        shm_outputs or None)


def _request_document(body: bytes, json_length: int | None) -> dict[str, Any]:
    """The body's JSON part (all of it without ``json_length``) as an object, or a ``BadRequest``."""
    try:
        text = body[:json_length] if json_length is not None else body
        doc = _loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body: not valid JSON ({exc})") from None
    except RecursionError:
        raise BadRequest("body: JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise BadRequest("body: expected a JSON object")
    return doc


def _input_header(f: str, t: Any, app: App, specs: dict[str, TensorSpec],
                  seen: set[str]) -> tuple[str, str, list[int]]:
    """One input tensor's name, datatype and shape, checked against the app's declared input
    (known, given once, same datatype, a shape it accepts); adds the name to ``seen``."""
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
    check_min_shape(f, spec, shape)
    return name, dt, shape


def _json_input(f: str, t: dict[str, Any], dt: str, shape: list[int]) -> Any:
    """An input sent as JSON ``data`` (flat, as OIP clients send it, or nested), as an array of
    ``shape``."""
    if "data" not in t:
        raise BadRequest(f"{f}.data: missing")
    data = t["data"]
    if not isinstance(data, list):
        raise BadRequest(f"{f}.data: expected an array")
    if list in set(map(type, data)):
        flat: list[Any] = []
        _flatten(data, flat)
    else:
        flat = data  # already flat, as OIP clients send it
    if len(flat) != math.prod(shape):
        raise BadRequest(f"{f}.data: {len(flat)} elements for shape {shape} "
                         f"(expected {math.prod(shape)})")
    arr = _to_array(f"{f}.data", dt, flat)
    if isinstance(arr, np.ndarray):
        arr = arr.reshape(shape)  # OIP sends data flattened (row-major); the shape restores it
    return arr


def _requested_outputs(doc: dict[str, Any], shm: SharedMemoryRegions | None
                       ) -> tuple[list[str] | None, set[str], dict[str, tuple[str, int, int]]]:
    """The outputs asked for (None: all), those to send binary, those to write to shared memory."""
    binary_outputs: set[str] = set()
    shm_outputs: dict[str, tuple[str, int, int]] = {}
    if "outputs" not in doc:
        return None, binary_outputs, shm_outputs
    raw = doc["outputs"]
    if not isinstance(raw, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                            for o in raw):
        raise BadRequest("outputs: expected an array of objects with a name")
    for i, o in enumerate(raw):
        oparams = o.get("parameters", {})
        if not isinstance(oparams, dict) or not isinstance(oparams.get("binary_data", False), bool):
            raise BadRequest(f"outputs[{i}].parameters.binary_data: expected true or false")
        if oparams.get("binary_data"):
            binary_outputs.add(o["name"])
        if "shared_memory_region" in oparams:
            shm_outputs[o["name"]] = shm_output(i, oparams, shm)
    return [o["name"] for o in raw], binary_outputs, shm_outputs


def shm_output(i: int, oparams: dict[str, Any], shm: SharedMemoryRegions | None) -> tuple[str, int, int]:
    """Where ``outputs[i]`` goes in shared memory (region, offset, byte size), checked now."""
    if shm is None:
        raise BadRequest(f"outputs[{i}].parameters.shared_memory_region: shared memory is not served here")
    try:
        return shm.target(f"outputs[{i}]", oparams)
    except ShmError as exc:
        raise BadRequest(str(exc)) from None


def request_timeout_us(params: dict[str, Any]) -> int | None:
    """``parameters.timeout`` (None without it), checked with ``parameters.priority`` (only 0)."""
    timeout_us = params.get("timeout")
    if "timeout" in params and (isinstance(timeout_us, bool) or not isinstance(timeout_us, int)
                                or timeout_us <= 0):
        raise BadRequest(f"parameters.timeout: expected a positive whole number of microseconds, "
                         f"got {timeout_us!r}")
    priority = params.get("priority", 0)
    if priority != 0 or isinstance(priority, bool):
        raise BadRequest(f"parameters.priority: {priority!r} is not supported: every request of a model "
                         "is served by its deadline in arrival order; omit priority or send 0")
    return timeout_us


def place_outputs(status: int, doc: dict[str, Any], targets: dict[str, tuple[str, int, int]],
                  shm: SharedMemoryRegions) -> tuple[int, dict[str, Any]]:
    """Write the outputs a request asked for in shared memory into their regions; each then carries
    ``shared_memory_region`` / ``shared_memory_byte_size`` and no data (as Triton answers). An
    output larger than its region's span is answered 400 naming it."""
    if status != 200:
        return status, doc
    for out in doc.get("outputs", []):
        where = targets.get(out["name"])
        if where is None:
            continue
        arr = np.asarray(out["data"])
        wire = DATATYPES[out["datatype"]]
        if wire is None:
            return 400, {"error": f"output {out['name']!r}: BYTES outputs cannot be written to shared memory"}
        raw = np.ascontiguousarray(arr.astype(wire, copy=False)).tobytes()
        try:
            shm.write(*where, raw)
        except ShmError as exc:
            return 400, {"error": f"output {out['name']!r}: {exc}"}
        del out["data"]
        params = out.setdefault("parameters", {})
        params["shared_memory_region"], params["shared_memory_byte_size"] = where[0], len(raw)
        if where[1]:
            params["shared_memory_offset"] = where[1]
    return status, doc


_NATIVE_KINDS = frozenset("biu")  # numpy kinds orjson serializes exactly as their ``tolist()``
_F8 = np.dtype("<f8")


def encode_response(doc: dict[str, Any], binary: set[str] | None,
                    all_binary: bool) -> tuple[bytes, int | None]:
    """The response body and, when some outputs go binary, the length of its JSON part.

    ``doc``'s outputs carry numpy arrays in ``data`` (``doc`` is updated in place); binary ones
    lose ``data`` and gain ``parameters.binary_data_size``, their bytes following the JSON in
    output order.
    """
    blobs = []
    for out in doc.get("outputs", []):
        if "data" not in out:  # written to shared memory (``place_outputs``)
            continue
        arr = np.asarray(out["data"])
        if all_binary or (binary and out["name"] in binary):
            wire = arr.astype(DATATYPES[out["datatype"]] or arr.dtype, copy=False)
            blobs.append(np.ascontiguousarray(wire).tobytes())
            del out["data"]
            out.setdefault("parameters", {})["binary_data_size"] = len(blobs[-1])
        elif (arr.dtype.kind in _NATIVE_KINDS or arr.dtype == _F8) and arr.dtype.isnative:
            out["data"] = arr.reshape(-1)  # orjson writes it as it writes the list: no int objects
        else:
            out["data"] = arr.reshape(-1).tolist()  # (orjson writes FP32 as float32, not as Python floats)
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
