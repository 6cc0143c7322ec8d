"""The binary tensor data extension: raw tensor bytes after the JSON header, in and out."""

from __future__ import annotations

import copy
import json
import urllib.request

import numpy as np
import pytest
from dpserver import EXAMPLE_NODE, http, image

from jigsaw.app import App, Task, TensorSpec, Variant
from jigsaw.runtime.oip import BadRequest, encode_response, header_length, parse_infer_request

APP = App("m", (Task("t", "generic", (Variant("v", 1.0),)),), (), 100.0,
          inputs=(TensorSpec("x", "FP32", (-1, 2)), TensorSpec("k", "INT64", (-1,))))


def binary_body(tensors: list[tuple[str, str, np.ndarray]], json_inputs: list[dict] | None = None,
                **extra: object) -> tuple[bytes, int]:
    inputs = [{"name": n, "datatype": dt, "shape": list(a.shape),
               "parameters": {"binary_data_size": a.nbytes}} for n, dt, a in tensors]
    head = json.dumps({"inputs": inputs + (json_inputs or []), **extra}).encode()
    return head + b"".join(a.tobytes() for _, _, a in tensors), len(head)


def test_binary_inputs_are_read_in_order_after_the_json():
    x = np.arange(6, dtype="<f4").reshape(3, 2) / 4
    k = np.array([7, -1], dtype="<i8")
    body, n = binary_body([("x", "FP32", x), ("k", "INT64", k)])
    r = parse_infer_request(body, APP, header_length(str(n), len(body)))
    got = {name: arr for name, _, _, arr in r.inputs}
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["k"], k)
    # binary and JSON tensors mix
    as_json = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}
    body, n = binary_body([("k", "INT64", k)], [as_json])
    r = parse_infer_request(body, APP, n)
    assert {name: arr.tolist() for name, _, _, arr in r.inputs} == {"k": [7, -1], "x": [[1.0, 2.0]]}


X = np.zeros((1, 2), "<f4")
K = np.zeros(1, "<i8")


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda b, n: (b + b"\0", n), "body: 1 bytes of binary data"),  # bytes left over
    (lambda b, n: (b[:-1], n), "inputs[1]: the body holds"),  # too few bytes
    (lambda b, n: (b.replace(b'"binary_data_size": 8}', b'"binary_data_size": 4}', 1), n),
     "inputs[0].parameters.binary_data_size: 4 bytes"),
    (lambda b, n: (b.replace(b'"binary_data_size": 8}', b'"binary_data_size": "8"}', 1), n + 2),
     "inputs[0].parameters.binary_data_size: expected"),
])
def test_bad_binary_bodies_name_the_field(mutate, field):
    body, n = binary_body([("x", "FP32", X), ("k", "INT64", K)])
    body, n = mutate(body, n)
    with pytest.raises(BadRequest) as exc:
        parse_infer_request(body, APP, n)
    assert str(exc.value).startswith(field)


def test_binary_needs_the_header_and_finite_floats():
    body, n = binary_body([("x", "FP32", X), ("k", "INT64", K)])
    with pytest.raises(BadRequest, match=r"needs the Inference-Header-Content-Length header"):
        parse_infer_request(body[:n], APP)
    for bad in ("x", "-1", str(len(body) + 1)):
        with pytest.raises(BadRequest, match=r"^Inference-Header-Content-Length"):
            header_length(bad, len(body))
    nan, n = binary_body([("x", "FP32", np.array([[np.nan, 1]], "<f4")), ("k", "INT64", K)])
    with pytest.raises(BadRequest, match="finite"):
        parse_infer_request(nan, APP, n)


def test_response_sends_asked_outputs_as_bytes():
    doc = {"outputs": [{"name": "a.label", "datatype": "INT32", "shape": [2], "data": np.array([3, 4])},
                       {"name": "a.score", "datatype": "FP32", "shape": [2], "data": np.array([0.5, 0.25])}]}
    body, n = encode_response(copy.deepcopy(doc), None, False)
    assert n is None and json.loads(body)["outputs"][0]["data"] == [3, 4]
    body, n = encode_response(doc, {"a.score"}, False)
    head = json.loads(body[:n])
    assert head["outputs"][0]["data"] == [3, 4] and "data" not in head["outputs"][1]
    assert head["outputs"][1]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(body[n:], "<f4"), [0.5, 0.25])


def test_served_binary_round_trip(server_factory):
    s = server_factory(["--node-config", str(EXAMPLE_NODE), "--apps", "traffic_analysis",
                        "--demand", "10", "--plan-time-limit", "3"])
    _, meta, _ = http("GET", s.url + "/v2")
    assert "binary_tensor_data" in meta["extensions"]
    pixels = np.arange(16, dtype=np.uint8)
    head = json.dumps({"id": "b1", "inputs": [{"name": "image", "datatype": "UINT8", "shape": [16],
                                                "parameters": {"binary_data_size": 16}}],
                       "outputs": [{"name": "car.score", "parameters": {"binary_data": True}},
                                   {"name": "car.label"}]}).encode()
    req = urllib.request.Request(s.url + "/v2/models/traffic_analysis/infer", data=head + pixels.tobytes(),
                                 method="POST", headers={"Inference-Header-Content-Length": str(len(head)),
                                                         "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body, n = r.read(), int(r.headers["Inference-Header-Content-Length"])
        assert r.headers["Content-Type"].startswith("application/octet-stream")
    doc = json.loads(body[:n])
    outs = {o["name"]: o for o in doc["outputs"]}
    assert doc["id"] == "b1" and set(outs) == {"car.score", "car.label"}
    cars = outs["car.label"]["shape"][0]
    assert len(outs["car.label"]["data"]) == cars and "data" not in outs["car.score"]
    assert outs["car.score"]["parameters"]["binary_data_size"] == len(body) - n == 4 * cars
    # the same request in JSON gets the same kind of answer
    status, out, _ = http("POST", s.url + "/v2/models/traffic_analysis/infer", image(16))
    assert status == 200 and {o["name"] for o in out["outputs"]} >= {"car.score", "car.label"}
    # a binary body without its header is refused, and the server carries on
    status, out, _ = http("POST", s.url + "/v2/models/traffic_analysis/infer", raw=head + pixels.tobytes())
    assert status == 400
