"""The OpenAPI document: valid OpenAPI 3.0, precise per served app, never stricter than the server.

The fuzz test (test_fuzz_openapi.py) trusts the document: a body it calls invalid must get a
4xx. Here that promise is checked in-process against ``oip.parse_infer_request``, and the
document a live daemon serves is compared with the one built from its app file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from jigsaw import __version__
from jigsaw.app import App, Task, TensorSpec, Variant, load_app
from jigsaw.backends.base import OutputSpec
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.runtime.oip import BadRequest, parse_infer_request
from jigsaw.runtime.openapi import example_request, openapi_document

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
from dpserver import ROOT, Server, http, write_tiny

EXAMPLE_APPS = sorted((ROOT / "examples" / "apps").glob("*.toml"))


def emulated_outputs(app: App) -> dict[str, list[OutputSpec]]:
    return {t: EmulatedBackend.output_specs(app.task(t).kind, app.children(t)) for t in app.sinks}


def document(*apps: App) -> dict[str, Any]:
    return openapi_document({a.name: a for a in apps}, {a.name: emulated_outputs(a) for a in apps},
                            version=__version__, backend_kind="emulated")


def resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = doc["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def body_validator(doc: dict[str, Any], model: str) -> OAS30Validator:
    op = doc["paths"][f"/v2/models/{model}/infer"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return OAS30Validator({"$ref": ref, "components": doc["components"]})


SENSORS = App(
    "sensors", (Task("det", "detector", (Variant("det-v", 1.0),)),
                Task("cls", "classifier", (Variant("cls-v", 1.0),))), (), 100.0,
    inputs=(TensorSpec("image", "UINT8", (-1,)), TensorSpec("meta", "FP32", (2,)),
            TensorSpec("mask", "BOOL", (-1, 3)), TensorSpec("tags", "BYTES", (-1,)),
            TensorSpec("ids", "INT64", (4, 4)), TensorSpec("raw", "BF16", (-1,))),
)


@pytest.mark.parametrize("apps", [[load_app(p) for p in EXAMPLE_APPS], [SENSORS]],
                         ids=["example apps", "every datatype"])
def test_document_is_valid_openapi_30(apps: list[App]) -> None:
    doc = document(*apps)
    validate(doc)
    assert doc["openapi"] == "3.0.3" and doc["info"]["version"] == __version__
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/metrics", "/v2/openapi.json"):
        assert "get" in doc["paths"][path]
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_every_served_model_has_its_paths_and_inputs() -> None:
    apps = [load_app(p) for p in EXAMPLE_APPS] + [SENSORS]
    doc = document(*apps)
    for app in apps:
        for base in (f"/v2/models/{app.name}", f"/v2/models/{app.name}/versions/1"):
            assert {"get"} == set(doc["paths"][base]) == set(doc["paths"][base + "/ready"])
            infer = doc["paths"][base + "/infer"]["post"]
            assert set(infer["responses"]) == {"200", "400", "404", "405", "413", "503", "504"}
            assert infer["responses"]["503"]["headers"]["Retry-After"]["required"]
            body = resolve(doc, infer["requestBody"]["content"]["application/json"]["schema"])
            inputs = body["properties"]["inputs"]
            assert inputs["minItems"] == inputs["maxItems"] == len(app.inputs)
            tensors = inputs["items"].get("oneOf", [inputs["items"]])
            declared = {(t["properties"]["name"]["enum"][0], t["properties"]["datatype"]["enum"][0],
                         t["properties"]["shape"]["minItems"]) for t in tensors}
            assert declared == {(s.name, s.datatype, len(s.shape)) for s in app.inputs}
            outputs = body["properties"]["outputs"]["items"]["properties"]["name"]["enum"]
            assert outputs == [f"{t}.{s.name}" for t, ss in emulated_outputs(app).items() for s in ss]
            assert body_validator(doc, app.name).is_valid(infer["requestBody"]["content"]["application/json"]
                                                          ["example"])


def test_document_follows_the_apps_it_is_given() -> None:
    odd = App("a b/c", SENSORS.tasks, (), 100.0)
    doc = document(odd)
    validate(doc)
    assert "/v2/models/a%20b%2Fc/infer" in doc["paths"]
    assert not any("/v2/models/sensors" in p for p in doc["paths"])
    assert "/v2/models/sensors/infer" in document(odd, SENSORS)["paths"]


def _tensor(name: str, datatype: str, shape: list[Any], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


OK_IDS = _tensor("ids", "INT64", [4, 4], [[i] * 4 for i in range(4)])
OK = [_tensor("image", "UINT8", [2], [0, 255]), _tensor("meta", "FP32", [2], [0.5, -1]),
      _tensor("mask", "BOOL", [1, 3], [[True, False, True]]), _tensor("tags", "BYTES", [1], ["a"]), OK_IDS,
      _tensor("raw", "BF16", [0], [])]


def _with(i: int, **changes: Any) -> dict[str, Any]:
    inputs = [dict(t) for t in OK]
    inputs[i].update(changes)
    return {"inputs": inputs}


# (body, the schema's verdict, the server's verdict); the schema may accept what only the server can
# refuse (counts, duplicates), never the other way round.
CASES = {
    "all valid": ({"id": "x", "inputs": OK, "parameters": {"k": 1}}, True, True),
    "reordered, id null": ({"id": None, "inputs": OK[::-1]}, True, True),
    "nested data": (_with(0, data=[[0], [[255]]]), True, True),
    "uint8 above range": (_with(0, data=[0, 256]), False, False),
    "uint8 negative": (_with(0, data=[-1, 0]), False, False),
    "int for fp32 is fine": (_with(1, data=[1, 2]), True, True),
    "true as uint8": (_with(0, data=[True, 0]), False, False),
    "false as fp32": (_with(1, data=[False, 0.5]), False, False),
    "number as bool": (_with(2, data=[[1, 0, 1]]), False, False),
    "number as bytes": (_with(3, data=[1]), False, False),
    "float as int64": (_with(4, data=[[0.5] * 4] * 4), False, False),
    "bf16 data": (_with(5, shape=[1], data=[1.0]), False, False),
    "wrong datatype": (_with(0, datatype="FP32"), False, False),
    "unknown input": (_with(0, name="picture"), False, False),
    "wrong rank": (_with(1, shape=[2, 1]), False, False),
    "wrong fixed dimension": (_with(1, shape=[3], data=[1, 2, 3]), False, False),
    "negative dimension": (_with(0, shape=[-2]), False, False),
    "data not an array": (_with(0, data=5), False, False),
    "no data": ({"inputs": [*OK[:5], {"name": "raw", "datatype": "BF16", "shape": [0]}]}, False, False),
    "missing input": ({"inputs": OK[:5]}, False, False),
    "count does not match the shape": (_with(0, shape=[3]), True, False),
    "one input twice": ({"inputs": [*OK[:5], OK[0]]}, True, False),
    "id not a string": ({"id": 7, "inputs": OK}, False, False),
    "parameters null": ({"inputs": OK, "parameters": None}, False, False),
    "not an object": ([OK], False, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_schema_is_never_stricter_than_the_server(case: str) -> None:
    body, schema_ok, server_ok = CASES[case]
    assert body_validator(document(SENSORS), "sensors").is_valid(body) == schema_ok
    try:
        parse_infer_request(json.dumps(body).encode(), SENSORS)
        accepted = True
    except BadRequest:
        accepted = False
    assert accepted == server_ok


def test_example_requests_are_accepted() -> None:
    for app in [load_app(p) for p in EXAMPLE_APPS] + [SENSORS]:
        parse_infer_request(json.dumps(example_request(app)).encode(), app)


def test_outputs_are_named_from_the_known_ones() -> None:
    check = body_validator(document(SENSORS), "sensors")
    assert check.is_valid({"inputs": OK, "outputs": [{"name": "cls.label"}, {"name": "det.num_boxes"}]})
    assert not check.is_valid({"inputs": OK, "outputs": [{"name": "cls.nope"}]})
    assert not check.is_valid({"inputs": OK, "outputs": [{}]})


def test_a_live_daemon_serves_the_document_of_its_app(tmp_path: Path) -> None:
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1), ("b", "classifier", {1: 1.0}, 1)],
                      edges=[("a", "b", 1.0)], two_inputs=True)
    expected = document(load_app(tmp_path / "tiny" / "app.toml"))
    with Server(args, tmp_path / "jigsawd.log") as server:
        status, served, headers = http("GET", server.url + "/v2/openapi.json")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert served == expected
    body = resolve(served, {"$ref": served["paths"]["/v2/models/tiny/infer"]["post"]["requestBody"]
                            ["content"]["application/json"]["schema"]["$ref"]})
    assert [t["properties"]["name"]["enum"] for t in body["properties"]["inputs"]["items"]["oneOf"]] == \
        [["image"], ["meta"]]
