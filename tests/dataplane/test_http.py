"""Every endpoint of the Open Inference Protocol frontend, and every kind of bad request."""

from __future__ import annotations

import json

from dpserver import http, image, write_tiny


def test_endpoints_and_bad_requests(server_factory, tmp_path):
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1)], two_inputs=True,
                      max_payload_bytes=4096)
    s = server_factory(args)
    u = s.url
    assert http("GET", u + "/v2")[0] == 200
    assert http("GET", u + "/v2")[1]["name"] == "jigsaw"
    assert http("GET", u + "/v2/health/live") == (200, {"live": True}, http("GET", u + "/v2/health/live")[2])
    assert http("GET", u + "/v2/health/ready")[1] == {"ready": True}
    status, meta, _ = http("GET", u + "/v2/models/tiny")
    assert status == 200 and meta["name"] == "tiny"
    assert [i["name"] for i in meta["inputs"]] == ["image", "meta"]
    assert {o["name"] for o in meta["outputs"]} == {"a.label", "a.score", "a.box"}  # the real backends'
    assert http("GET", u + "/v2/models/tiny/ready")[1] == {"name": "tiny", "ready": True}
    assert http("GET", u + "/v2/models/tiny/versions/1/ready")[0] == 200

    good = image(3, rid="req-7")
    good["inputs"].append({"name": "meta", "datatype": "FP32", "shape": [2], "data": [0.5, 1.5]})
    status, out, _ = http("POST", u + "/v2/models/tiny/infer", good)
    assert status == 200, out
    assert out["id"] == "req-7" and out["model_name"] == "tiny"
    assert out["parameters"]["backend"] == "emulated" and out["parameters"]["lane.a"] == "a-v"
    assert "compute_us.a" in out["parameters"]
    names = {o["name"]: o for o in out["outputs"]}
    assert names["a.label"]["shape"] == [1] and names["a.label"]["datatype"] == "INT32"
    assert names["a.label"]["parameters"]["emulated"] is True
    # nested data is accepted and flattened
    nested = json.loads(json.dumps(good))
    nested["inputs"][1]["data"] = [[0.5, 1.5]]
    assert http("POST", u + "/v2/models/tiny/infer", nested)[0] == 200
    # requested outputs filter the response
    only = dict(good, outputs=[{"name": "a.score"}])
    assert [o["name"] for o in http("POST", u + "/v2/models/tiny/infer", only)[1]["outputs"]] == ["a.score"]

    def bad(body=None, raw=None, path="/v2/models/tiny/infer", method="POST"):
        status, doc, headers = http(method, u + path, body, raw=raw)
        assert isinstance(doc, dict) and "error" in doc, doc
        return status, doc["error"], headers

    def with_input(i, **change):
        b = json.loads(json.dumps(good))
        b["inputs"][i].update(change)
        return b

    assert bad(raw=b"{not json")[:2][0] == 400
    assert "JSON" in bad(raw=b"{not json")[1]
    assert bad(raw=b"[1, 2]")[0] == 400
    assert "inputs" in bad({"inputs": []})[1]
    s_, msg, _ = bad(with_input(0, name="picture"))
    assert s_ == 400 and "unknown input 'picture'" in msg
    s_, msg, _ = bad({"inputs": good["inputs"][:1]})
    assert s_ == 400 and "missing input 'meta'" in msg
    s_, msg, _ = bad(with_input(1, datatype="INT32"))
    assert s_ == 400 and "inputs[1].datatype" in msg
    s_, msg, _ = bad(with_input(1, shape=[3], data=[1.0, 2.0, 3.0]))
    assert s_ == 400 and "inputs[1].shape" in msg
    s_, msg, _ = bad(with_input(1, shape=[1, 2]))
    assert s_ == 400 and "inputs[1].shape" in msg
    s_, msg, _ = bad(with_input(0, shape=[5]))
    assert s_ == 400 and "inputs[0].data" in msg and "5" in msg
    s_, msg, _ = bad(with_input(1, data=["x", "y"]))
    assert s_ == 400 and "inputs[1].data" in msg
    s_, msg, _ = bad(with_input(0, data=[1, 2, 300]))
    assert s_ == 400 and "out of range" in msg
    s_, msg, _ = bad(with_input(0, data=[1, 2, 3.5]))
    assert s_ == 400 and "integers" in msg
    s_, msg, _ = bad(dict(good, id=5))
    assert s_ == 400 and msg.startswith("id")
    s_, msg, _ = bad(dict(good, outputs=[{"name": "nope"}]))
    assert s_ == 400 and "nope" in msg
    # 413: over server.max_payload_bytes (4096 here)
    s_, msg, _ = bad(image(3000))
    assert s_ == 413 and "4096" in msg
    # 404: unknown model, unknown version, unknown path; 405: wrong method
    s_, msg, _ = bad(good, path="/v2/models/nope/infer")
    assert s_ == 404 and "nope" in msg
    assert bad(path="/v2/models/nope", method="GET")[0] == 404
    assert bad(path="/v2/models/tiny/versions/9/ready", method="GET")[0] == 404
    assert bad(path="/v3/anything", method="GET")[0] == 404
    s_, msg, headers = bad(path="/v2/models/tiny/infer", method="GET")
    assert s_ == 405 and "POST" in headers.get("Allow", "")

    status, text, headers = http("GET", u + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'jigsaw_backend_info{kind="emulated"} 1' in text
    assert 'jigsaw_inference_request_success_total{app="tiny"} 3' in text
    assert 'jigsaw_inference_request_failure_total{app="tiny",reason="bad_request"}' in text
    assert 'jigsaw_inference_request_duration_us_bucket{app="tiny",le="+Inf"} 3' in text
    assert 'jigsaw_inference_batch_size_bucket{app="tiny",le="1",task="a",variant="a-v"} 3' in text
    assert 'jigsaw_inference_queue_duration_us_count{app="tiny",task="a"} 3' in text
    assert "jigsaw_instance_busy_fraction{" in text
    assert 'jigsaw_slices_in_use{app="tiny"} 1' in text
