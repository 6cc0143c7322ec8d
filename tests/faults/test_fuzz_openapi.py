"""Schema-driven fuzzing of a real jigsawd from the OpenAPI document it serves (schemathesis).

Every operation of ``/v2/openapi.json`` gets its documented example, schemathesis' coverage
cases and a fixed, derandomized budget of generated requests, valid and invalid, so CI sends
the same requests on every run. Each answer must be documented (status, content type, body
schema, headers), a body the document calls invalid must be rejected with a 4xx, every error
must be JSON naming the problem, and no 5xx may appear except the protocol's 503/504 of infer.
Afterwards the node must be unchanged: ready, the same worker processes, answering 200.
"""

from __future__ import annotations

import copy
import itertools
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core import NOT_SET
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
from dpserver import Server, http, worker_pids, write_tiny

from jigsaw.testing import shm_entries

MAX_PAYLOAD = 16384
MAX_EXAMPLES = 50  # generated requests per operation (plus its example and coverage cases)
REQUEST_TIMEOUT_S = 10.0
READINESS_PATHS = ("/v2/health/ready", "/ready")
ZERO = {"BOOL": False, "BYTES": "", "FP16": 0.0, "FP32": 0.0, "FP64": 0.0}


@pytest.fixture(scope="module", params=["one_input", "two_inputs"])
def node(request: pytest.FixtureRequest, http_front: str, tmp_path_factory: pytest.TempPathFactory):
    """One input like every example app; two make the tensors a ``oneOf`` and add FP32 data."""
    tmp = tmp_path_factory.mktemp("fuzz-openapi")
    args = write_tiny(tmp, tasks=[("a", "classifier", {1: 1.0, 2: 1.5}, 2),
                                  ("b", "classifier", {1: 1.0, 2: 1.5}, 2)],
                      edges=[("a", "b", 1.0)], two_inputs=request.param == "two_inputs",
                      max_payload_bytes=MAX_PAYLOAD, latency_slo_ms=2000.0)
    with Server(args, tmp / "jigsawd.log") as server:
        server.worker_pids = worker_pids(server.proc.pid)
        meta = http("GET", server.url + "/v2/models/tiny")[1]
        server.inputs = {t["name"]: (t["datatype"], tuple(t["shape"])) for t in meta["inputs"]}
        yield server
    assert shm_entries(server.proc.pid) == []


@pytest.fixture(scope="module")
def api_schema(node: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(node.url + "/v2/openapi.json", timeout=REQUEST_TIMEOUT_S)


def _leaves(data: list[Any], out: list[Any]) -> None:
    for x in data:
        if isinstance(x, list):
            _leaves(x, out)
        else:
            out.append(x)


def fill_shapes(body: Any, inputs: dict[str, tuple[str, tuple[int, ...]]]) -> Any:
    """Each tensor gets a shape its data fills, keeping every value (a JSON Schema cannot tie them).

    Without it nearly every generated body is a 400 for the count alone: positive cases never
    reach the workers, and a negative case whose one invalid value the server accepts would
    still be rejected for its count, hiding the gap. Tensors the case made malformed (rank,
    non-integer dimensions, data not an array, unknown name) are left as they are.
    """
    body = copy.deepcopy(body)
    tensors = body.get("inputs") if isinstance(body, dict) else None
    for t in tensors if isinstance(tensors, list) else []:
        spec = inputs.get(t.get("name")) if isinstance(t, dict) and isinstance(t.get("name"), str) else None
        shape, data = (t.get("shape"), t.get("data")) if spec else (None, None)
        if not (spec and isinstance(data, list) and isinstance(shape, list) and len(shape) == len(spec[1])
                and all(type(d) is int and d >= 0 for d in shape)):
            continue
        flat: list[Any] = []
        _leaves(data, flat)
        free = [i for i, d in enumerate(spec[1]) if d == -1]
        fixed = math.prod(d for i, d in enumerate(shape) if i not in free)
        if free and fixed:
            shape = [1 if i in free else d for i, d in enumerate(shape)]
            shape[free[0]] = -(-len(flat) // fixed)
        elif fixed < len(flat):
            continue  # only dropping values would fit: keep the case as generated
        size = math.prod(shape)
        values = itertools.cycle(flat or [ZERO.get(spec[0], 0)])
        t["shape"], t["data"] = shape, list(itertools.islice(values, size))
    return body


def no_server_error_but_shedding(ctx: Any, response: Any, case: Any) -> None:
    """5xx only as what the protocol promises: 503 (shed, not ready) and 504 (deadline) of infer."""
    status = response.status_code
    if status >= 500 and not (case.path.endswith("/infer") and status in (503, 504)):
        raise AssertionError(f"{case.method} {case.path} answered {status}: {response.text[:500]}")


def errors_are_json_naming_the_problem(ctx: Any, response: Any, case: Any) -> None:
    """Every error is ``{"error": "..."}``; readiness answers 503 with its own ``ready: false``."""
    if response.status_code < 400:
        return
    if response.status_code == 503 and case.path.endswith(READINESS_PATHS):
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"{response.status_code} is not JSON: {response.text[:200]!r}") from None
    if not (isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]):
        raise AssertionError(f"{response.status_code} without an error message: {body!r}")


CHECKS = [no_server_error_but_shedding, errors_are_json_naming_the_problem, status_code_conformance,
          content_type_conformance, response_schema_conformance, response_headers_conformance,
          negative_data_rejection, unsupported_method]


MODEL_PATHS = ("/v2/models/tiny", "/v2/models/tiny/versions/1")
# Triton's extensions (runtime/triton_ext.py): statistics, config, repository, shared memory
EXTENSION_OPERATIONS = [
    "GET /v2/models/stats", "POST /v2/repository/index", "POST /v2/repository/models/{model}/load",
    "POST /v2/repository/models/{model}/unload", "GET /v2/systemsharedmemory/status",
    "POST /v2/systemsharedmemory/unregister", "GET /v2/systemsharedmemory/region/{name}/status",
    "POST /v2/systemsharedmemory/region/{name}/register",
    "POST /v2/systemsharedmemory/region/{name}/unregister",
    "GET /v2/cudasharedmemory/status",
    *(f"GET {base}{suffix}" for base in MODEL_PATHS for suffix in ("/stats", "/config"))]
OPERATIONS = ["GET /v2", "GET /v2/health/live", "GET /v2/health/ready", "GET /metrics",
              *(f"{method} {base}{suffix}" for base in MODEL_PATHS
                for method, suffix in (("GET", ""), ("GET", "/ready"), ("POST", "/infer"))),
              *EXTENSION_OPERATIONS]


def test_every_served_operation_is_fuzzed(api_schema: schemathesis.BaseSchema) -> None:
    """Nothing is silently left out (schemathesis skips the document's own path by design)."""
    api_schema.validate()
    assert sorted(r.ok().label for r in api_schema.get_all_operations()) == sorted(OPERATIONS)


@pytest.mark.parametrize("label", OPERATIONS)
def test_fuzz_operation(node: Server, api_schema: schemathesis.BaseSchema, label: str,
                        request: pytest.FixtureRequest) -> None:
    """Coverage cases (the example, boundaries, each mutation, undocumented methods), then fuzzing."""
    at = request.node.callspec.params
    if label in EXTENSION_OPERATIONS and (at.get("http_front"), at.get("node")) != ("fast", "one_input"):
        pytest.skip("the extension routes are aiohttp's whatever the front end and inputs: fuzzed once")

    def call(case: schemathesis.Case) -> None:
        if case.body is not NOT_SET:
            case.body = fill_shapes(case.body, node.inputs)
        case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

    method, path = label.split(" ", 1)
    operation = api_schema[path][method]
    generation = api_schema.config.generation_for(operation=operation)
    covered = 0
    for case in api_schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode),
                                               generation_config=generation):
        call(case)
        covered += 1
    assert covered > 1

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                          operation.as_strategy(GenerationMode.NEGATIVE)))
    def fuzz(case: schemathesis.Case) -> None:
        call(case)

    fuzz()


def test_node_survives_the_fuzzing(node: Server) -> None:
    assert http("GET", node.url + "/v2/health/ready")[0] == 200
    assert worker_pids(node.proc.pid) == node.worker_pids, "a worker died or was replaced"
    body = {"id": "after",
            "inputs": [{"name": "image", "datatype": "UINT8", "shape": [3], "data": [1, 2, 3]}]}
    if "meta" in node.inputs:
        body["inputs"].insert(0, {"name": "meta", "datatype": "FP32", "shape": [2], "data": [0.5, 1]})
    status, meta, _ = http("GET", node.url + "/v2/models/tiny")
    assert status == 200, meta
    declared = {o["name"] for o in meta["outputs"]}
    assert {"b.label", "b.score"} <= declared
    for _ in range(5):
        status, out, _ = http("POST", node.url + "/v2/models/tiny/infer", body)
        assert status == 200, out
        assert out["id"] == "after" and {o["name"] for o in out["outputs"]} == declared
