"""The OpenAPI 3.0 description of what jigsawd serves, built from the apps it serves right now.

Every served app gets concrete paths (no ``{model}`` parameter) whose request schema declares the
app's own input names, datatypes, ranks and value ranges, so a schema-driven fuzzer (schemathesis)
generates bodies that pass or fail validation for one precise reason. The schemas say exactly
what ``oip.parse_infer_request`` enforces and no more: a body the document calls invalid must be
rejected with a 4xx. What JSON Schema cannot say (data length = product of the shape, one tensor
per input name) is left to the server, which answers 400.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
from aiohttp import web

from jigsaw.app import App, TensorSpec
from jigsaw.backends.base import OutputSpec
from jigsaw.runtime.rings import DROP_REASONS
from jigsaw.tensors import DATATYPES

OPENAPI_PATH = "/v2/openapi.json"
VERSIONS = ("1",)

JSON = "application/json"
_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _element(datatype: str) -> dict[str, Any]:
    """One scalar of ``datatype`` as JSON carries it (oip.py's rules)."""
    if datatype == "BOOL":
        return {"type": "boolean"}
    if datatype == "BYTES":
        return {"type": "string"}
    if datatype == "BF16":
        return {"not": {}}  # BF16 over JSON is refused; only empty data passes
    dtype = DATATYPES[datatype]
    if dtype is not None and dtype.kind in "iu":
        info = np.iinfo(dtype)
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    return {"type": "number"}


def _data_item_name(datatype: str) -> str:
    return f"DataItem.{datatype}"


def _data_items() -> dict[str, Any]:
    """Per datatype: a scalar or an array of them, nested to any depth (OIP data may be nested)."""
    return {_data_item_name(dt): {"anyOf": [_element(dt),
                                            {"type": "array", "items": _ref(_data_item_name(dt))}]}
            for dt in DATATYPES}


def _shape(spec_shape: Sequence[int]) -> dict[str, Any]:
    """Rank fixed; a dimension is any non-negative integer unless every one is the same fixed size.

    OpenAPI 3.0 has no per-position ``items``, so mixed fixed/-1 dimensions are checked by the server.
    """
    dim: dict[str, Any] = {"type": "integer", "minimum": 0}
    fixed = set(spec_shape)
    if spec_shape and len(fixed) == 1 and -1 not in fixed:
        dim = {"type": "integer", "enum": [int(spec_shape[0])]}
    return {"type": "array", "items": dim, "minItems": len(spec_shape), "maxItems": len(spec_shape),
            "description": f"declared shape {list(spec_shape)} (-1: any size)"}


def _input_tensor(spec: TensorSpec) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"type": "string", "enum": [spec.name]},
            "datatype": {"type": "string", "enum": [spec.datatype]},
            "shape": _shape(spec.shape),
            "data": {"type": "array", "items": _ref(_data_item_name(spec.datatype)),
                     "description": "row-major values, flat or nested; as many as the shape's product"},
            "parameters": {"type": "object", "properties": {}, "not": {"required": ["binary_data_size"]},
                           "description": "binary_data_size only in a binary body (the "
                                          "Inference-Header-Content-Length header), in place of data"},
        },
    }


def _output_names(specs: Mapping[str, Sequence[OutputSpec]]) -> list[str]:
    return [f"{task}.{s.name}" for task, ss in specs.items() for s in ss]


def _one_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """Exactly one of ``schemas``; nothing at all when there are none."""
    if not schemas:
        return {"not": {}}
    return schemas[0] if len(schemas) == 1 else {"oneOf": schemas}


def _names(names: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": names} if names else {"not": {}}


def example_request(app: App) -> dict[str, Any]:
    """A body the server accepts: every input, each -1 dimension 1, data all zeros."""
    zero: dict[str, Any] = {"BOOL": False, "BYTES": ""}
    inputs = []
    for s in app.inputs:
        shape = [(0 if s.datatype == "BF16" else 1) if d == -1 else d for d in s.shape]
        inputs.append({"name": s.name, "datatype": s.datatype, "shape": shape,
                       "data": [zero.get(s.datatype, 0)] * math.prod(shape)})
    return {"id": "example", "inputs": inputs}


def infer_request_schema(app: App, outputs: Mapping[str, Sequence[OutputSpec]]) -> dict[str, Any]:
    """The body of ``POST .../infer`` for ``app``: one tensor per declared input, in any order."""
    tensors = [_input_tensor(s) for s in app.inputs]
    n = len(tensors)
    return {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string", "nullable": True},
            "parameters": {"type": "object", "properties": {
                "binary_data_output": {"type": "boolean"},
                "timeout": {"type": "integer", "minimum": 1,
                            "description": "microseconds: a deadline tighter than the model's SLO"},
                "priority": {"type": "integer", "enum": [0],
                             "description": "only the default 0; other values are refused with 400"}}},
            "inputs": {"type": "array", "minItems": n, "maxItems": n,
                       "items": _one_of(tensors),
                       "description": "each declared input exactly once: "
                                      + ", ".join(f"{s.name} ({s.datatype})" for s in app.inputs)},
            "outputs": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": _names(_output_names(outputs)),
                               "parameters": {"type": "object",
                                              "properties": {"binary_data": {"type": "boolean"}}}}}},
        },
    }


def _output_tensor(name: str, spec: OutputSpec) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"type": "string", "enum": [name]},
            "datatype": {"type": "string", "enum": [spec.datatype]},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0},
                      "minItems": len(spec.shape), "maxItems": len(spec.shape)},
            "data": {"type": "array", "items": _element(spec.datatype)},
            "parameters": {"type": "object"},
        },
    }


def infer_response_schema(app: App, outputs: Mapping[str, Sequence[OutputSpec]]) -> dict[str, Any]:
    tensors = [_output_tensor(f"{task}.{s.name}", s) for task, ss in outputs.items() for s in ss]
    return {
        "type": "object",
        "required": ["model_name", "model_version", "outputs", "parameters"],
        "properties": {
            "model_name": {"type": "string", "enum": [app.name]},
            "model_version": {"type": "string", "enum": list(VERSIONS)},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": _one_of(tensors)},
            "parameters": {"type": "object", "required": ["backend", "emulated", "e2e_us"],
                           "properties": {"backend": {"type": "string"}, "emulated": {"type": "boolean"},
                                          "e2e_us": {"type": "number", "minimum": 0}}},
        },
    }


def model_metadata_schema(app: App, outputs: Mapping[str, Sequence[OutputSpec]],
                          backend_kind: str) -> dict[str, Any]:
    def tensor(names: list[str]) -> dict[str, Any]:
        return {"type": "object", "required": ["name", "datatype", "shape"],
                "properties": {"name": _names(names), "datatype": {"type": "string"},
                               "shape": {"type": "array", "items": {"type": "integer", "minimum": -1}}}}

    return {
        "type": "object",
        "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {
            "name": {"type": "string", "enum": [app.name]},
            "versions": {"type": "array", "items": {"type": "string", "enum": list(VERSIONS)}},
            "platform": {"type": "string", "enum": [f"jigsaw_{backend_kind}"]},
            "inputs": {"type": "array", "items": tensor([s.name for s in app.inputs])},
            "outputs": {"type": "array", "items": tensor(_output_names(outputs))},
            "parameters": {"type": "object"},
        },
    }


def _common_schemas() -> dict[str, Any]:
    error = {"type": "object", "required": ["error"],
             "properties": {"error": {"type": "string", "minLength": 1}}}
    return {
        "Error": error,
        "DroppedError": {
            "type": "object", "required": ["error", "status", "task", "reason", "id"],
            "properties": {"error": {"type": "string", "minLength": 1}, "status": {"type": "string"},
                           "task": {"type": "string", "nullable": True},
                           "reason": {"type": "string", "enum": sorted(set(DROP_REASONS.values()))},
                           "items_lost": {"type": "number", "minimum": 1,
                                          "description": "items the dropping task would have produced "
                                                         "(its multiplicative factor): the violations "
                                                         "this drop counts for"},
                           "id": {"type": "string", "nullable": True}},
        },
        "ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"],
                           "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                          "extensions": {"type": "array", "items": {"type": "string"}}}},
        "Live": {"type": "object", "required": ["live"], "properties": {"live": {"type": "boolean"}}},
        "Ready": {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"}}},
        "ModelReady": {"type": "object", "required": ["name", "ready"],
                       "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}},
        **_data_items(),
    }


def _json(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {JSON: {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


def _infer_ok(key: str) -> dict[str, Any]:
    """JSON; or, when outputs were asked as binary data, that JSON followed by their bytes."""
    out = _json("the sink tasks' outputs (<task>.<output>)", _ref(f"InferResponse.{key}"))
    out["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    out["headers"] = {"Inference-Header-Content-Length": {
        "description": "with an octet-stream body: the length of its JSON part; the outputs with "
                       "parameters.binary_data_size follow it, in order", "required": False,
        "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
    return out


def _error(description: str) -> dict[str, Any]:
    return _json(description, _ref("Error"))


def _get(operation_id: str, summary: str, responses: dict[str, Any], tags: list[str]) -> dict[str, Any]:
    return {"get": {"operationId": operation_id, "summary": summary, "tags": tags, "responses": responses}}


def _extension_schemas() -> dict[str, Any]:
    count_ns = {"type": "object", "required": ["count", "ns"],
                "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}}}
    stats = {"type": "object", "required": ["name", "version", "inference_stats"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"}, "inference_count": {"type": "integer"},
        "execution_count": {"type": "integer"}, "last_inference": {"type": "integer"},
        "inference_stats": {"type": "object", "additionalProperties": count_ns},
        "batch_stats": {"type": "array", "items": {"type": "object"}}}}
    return {
        "ModelStatistics": {"type": "object", "required": ["model_stats"],
                            "properties": {"model_stats": {"type": "array", "items": stats}}},
        "ModelConfig": {"type": "object", "required": ["name", "platform", "input", "output"],
                        "properties": {"name": {"type": "string"}, "platform": {"type": "string"},
                                       "input": {"type": "array", "items": {"type": "object"}},
                                       "output": {"type": "array", "items": {"type": "object"}},
                                       "ensemble_scheduling": {"type": "object"},
                                       "jigsaw": {"type": "object"}}},
        "RepositoryIndex": {"type": "array", "items": {
            "type": "object", "required": ["name", "state"],
            "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                           "state": {"type": "string", "enum": ["READY", "UNAVAILABLE"]},
                           "reason": {"type": "string"}}}},
        "ShmStatus": {"type": "array", "items": {
            "type": "object", "required": ["name", "key", "offset", "byte_size"],
            "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                           "offset": {"type": "integer"}, "byte_size": {"type": "integer"}}}},
        "Empty": {"type": "object"},
    }


def _post(operation_id: str, summary: str, responses: dict[str, Any], body: dict[str, Any] | None
          ) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": ["extensions"],
                          "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": False, "content": {JSON: {"schema": body}}}
    return {"post": op}


def _extension_paths() -> dict[str, Any]:
    """Triton's statistics, repository and system shared memory routes (``triton_ext``)."""
    ok, bad = _json("done", _ref("Empty")), _error("invalid request; the message names the field")
    unknown = _error("no such model or region")
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
    register = {"type": "object", "required": ["key", "byte_size"], "properties": {
        "key": {"type": "string", "minLength": 1}, "offset": {"type": "integer", "minimum": 0},
        "byte_size": {"type": "integer", "minimum": 1}}}
    cuda = {"400": _error("CUDA shared memory is not supported (use system shared memory)")}
    paths: dict[str, Any] = {
        "/v2/models/stats": _get("statistics", "every served app's statistics", {
            "200": _json("Triton's statistics", _ref("ModelStatistics"))}, ["extensions"]),
        "/v2/repository/index": _post("repository_index", "the node's apps and their state", {
            "200": _json("index", _ref("RepositoryIndex")), "400": bad},
            {"type": "object", "properties": {"repository_name": {"type": "string"},
                                              "ready": {"type": "boolean"}}}),
        "/v2/systemsharedmemory/status": _get("shm_status", "registered regions", {
            "200": _json("regions", _ref("ShmStatus"))}, ["extensions"]),
        "/v2/systemsharedmemory/unregister": _post("shm_unregister_all", "unregister every region",
                                                   {"200": ok}, None),
        "/v2/cudasharedmemory/status": _get("cuda_shm_status", "CUDA shared memory (not supported)", cuda,
                                            ["extensions"]),
    }
    for verb in ("load", "unload"):
        paths[f"/v2/repository/models/{{model}}/{verb}"] = _post(
            f"repository_{verb}", f"{verb} an app (a node re-plan); answers once the node serves it",
            {"200": ok, "400": _error(f"the app cannot {verb} now; the message says why"), "404": unknown},
            {"type": "object", "properties": {"parameters": {"type": "object"}}})
        paths[f"/v2/repository/models/{{model}}/{verb}"]["post"]["parameters"] = [model]
    region = "/v2/systemsharedmemory/region/{name}"
    paths[region + "/status"] = {"get": {**_get("shm_region_status", "one region", {
        "200": _json("region", _ref("ShmStatus")), "404": unknown}, ["extensions"])["get"],
        "parameters": [name]}}
    paths[region + "/register"] = _post("shm_register", "register [offset, offset + byte_size) of a "
                                        "POSIX shared memory object (owner-only, mode 0600)",
                                        {"200": ok, "400": bad}, register)
    paths[region + "/register"]["post"]["parameters"] = [name]
    paths[region + "/unregister"] = _post("shm_unregister", "unregister one region", {"200": ok}, None)
    paths[region + "/unregister"]["post"]["parameters"] = [name]
    return paths


def _component_key(name: str, taken: set[str]) -> str:
    key = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"
    base, k = key, 1
    while key in taken:
        k += 1
        key = f"{base}-{k}"
    taken.add(key)
    return key


def openapi_document(apps: Mapping[str, App], output_specs: Mapping[str, Mapping[str, Sequence[OutputSpec]]],
                     *, version: str, backend_kind: str) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of every route, with each app's own infer request/response schema.

    ``apps`` maps the served name to its app; ``output_specs`` maps it to {sink task: outputs}
    (what the frontend answers with). Pure: the frontend calls it per request, so a
    reconfiguration that switches an app is described as soon as it serves.
    """
    schemas = _common_schemas()
    server_tag, model_tag, ext_tag = ["server"], ["models"], ["extensions"]
    paths: dict[str, Any] = {
        "/v2": _get("server_metadata", "server metadata",
                    {"200": _json("name, version", _ref("ServerMetadata"))}, server_tag),
        "/v2/health/live": _get("server_live", "liveness",
                                {"200": _json("the process answers", _ref("Live"))}, server_tag),
        "/v2/health/ready": _get("server_ready", "readiness", {
            "200": _json("every app of the node serves and every worker is up (Triton's strict readiness)",
                         _ref("Ready")),
            "503": _json("starting, shutting down, or an app of the node failed to load (its "
                         "/v2/models/{app}/ready answers 503 with the reason; the others serve)",
                         _ref("Ready"))}, server_tag),
        "/metrics": _get("metrics", "Prometheus metrics", {
            "200": {"description": "Prometheus text format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}}, server_tag),
        OPENAPI_PATH: _get("openapi", "this document", {
            "200": _json("OpenAPI 3.0 document", {"type": "object", "required": ["openapi", "paths"]})},
            server_tag),
    }
    schemas.update(_extension_schemas())
    paths.update(_extension_paths())
    taken: set[str] = set(schemas)
    for name, app in apps.items():
        outputs = output_specs.get(name, {})
        key = _component_key(name, taken)
        schemas[f"InferRequest.{key}"] = infer_request_schema(app, outputs)
        schemas[f"InferResponse.{key}"] = infer_response_schema(app, outputs)
        schemas[f"ModelMetadata.{key}"] = model_metadata_schema(app, outputs, backend_kind)
        quoted = quote(name, safe="")
        for suffix, variant in [("", "")] + [(f"/versions/{v}", f"_v{v}") for v in VERSIONS]:
            base = f"/v2/models/{quoted}{suffix}"
            op = f"{key}{variant}"
            not_found = _error("no such model or version (e.g. removed by a reconfiguration)")
            paths[base] = _get(f"model_metadata.{op}", f"{name}: inputs, outputs", {
                "200": _json("metadata", _ref(f"ModelMetadata.{key}")), "404": not_found}, model_tag)
            paths[base + "/ready"] = _get(f"model_ready.{op}", f"{name}: readiness", {
                "200": _json("ready", _ref("ModelReady")), "503": _json("not ready", _ref("ModelReady")),
                "404": not_found}, model_tag)
            paths[base + "/stats"] = _get(f"model_statistics.{op}", f"{name}: statistics, its tasks as "
                                          "composing models", {"200": _json("Triton's statistics",
                                                                            _ref("ModelStatistics")),
                                                               "404": not_found}, ext_tag)
            paths[base + "/config"] = _get(f"model_config.{op}", f"{name}: Triton's ensemble config and the "
                                           "running plan", {"200": _json("Triton's model config",
                                                                         _ref("ModelConfig")),
                                                            "404": not_found}, ext_tag)
            paths[base + "/infer"] = {"post": {
                "operationId": f"model_infer.{op}",
                "summary": f"{name}: run one request through the app's task graph",
                "tags": model_tag,
                "requestBody": {"required": True, "content": {JSON: {
                    "schema": _ref(f"InferRequest.{key}"), "example": example_request(app)}}},
                "responses": {
                    "200": _infer_ok(key),
                    "400": _error("malformed body; the message names the field"),
                    "404": not_found,
                    "405": _error("method not allowed"),
                    "413": _error("body over server.max_payload_bytes"),
                    "503": _json("shed (in-flight limit, full rings), not ready or shutting down",
                                 _ref("Error"), _RETRY_AFTER),
                    "504": _json("dropped by a task or past its deadline", _ref("DroppedError")),
                },
            }}
    return {
        "openapi": "3.0.3",
        "info": {"title": "jigsawd: Open Inference Protocol (KServe v2) REST", "version": version,
                 "description": f"backend: {backend_kind}; served models: {', '.join(apps) or 'none'}"},
        "tags": [{"name": "server"}, {"name": "models"}, {"name": "extensions"}],
        "paths": paths,
        "components": {"schemas": schemas},
    }


def add_openapi_route(web_app: web.Application, get_document: Callable[[], dict[str, Any]]) -> None:
    """Serve ``GET /v2/openapi.json``; the document is rebuilt per request, so it follows swaps."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(get_document())

    web_app.router.add_get(OPENAPI_PATH, handler)
