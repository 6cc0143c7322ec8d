"""An unmodified ``tritonclient`` (gRPC and HTTP) against a real jigsawd serving the three example
apps (emulated): inference (raw and typed contents, streaming), errors and their codes,
statistics, model config, repository, system shared memory. One daemon for the module.
"""

from __future__ import annotations

import json
import os
import queue
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

tritonclient = pytest.importorskip("tritonclient.grpc")
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as pbg  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from jigsaw.testing import ServerProcess, free_port, jigsawd, shm_entries  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APPS = ("traffic_analysis", "social_media", "ar_assistant")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("triton")
    port = free_port()
    # whole MIG instances (no MIG-instance shares): the stream test sends six requests at once to a
    # plan for 5 rps, which the whole instances' spare capacity admits (fitted to 5 rps with shares,
    # the door admits what they finish within the SLO and sheds two of them)
    text = (ROOT / "examples" / "h100x4.toml").read_text().replace('"apps/', f'"{ROOT}/examples/apps/')
    text = text.replace('"../profiles', f'"{ROOT}/profiles')
    text = text.replace("count = 4\n", "count = 4\nmig_shares = []\n")
    node_file = tmp / "h100x4.toml"
    node_file.write_text(text)
    server = jigsawd(["--node-config", str(node_file), "--demand", "5",
                      "--no-controller"], tmp / "jigsawd.log", cwd=ROOT, grpc_port=port)
    server.grpc_port = port  # type: ignore[attr-defined]
    with server:
        yield server
    assert shm_entries(server.proc.pid) == []


@pytest.fixture(scope="module")
def gc(node: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{node.grpc_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def hc(node: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{node.port}")
    yield c
    c.close()


def _image(mod: object, n: int = 8) -> object:
    x = mod.InferInput("image", [n], "UINT8")  # type: ignore[attr-defined]
    x.set_data_from_numpy(np.arange(n, dtype=np.uint8))
    return x


def _code(exc: InferenceServerException) -> str:
    return str(exc.status())


def test_health_and_metadata_agree(gc, hc) -> None:
    assert gc.is_server_live() and gc.is_server_ready()
    meta = gc.get_server_metadata()
    assert meta.name == "jigsaw"
    assert {"statistics", "model_configuration", "model_repository", "system_shared_memory"} <= \
        set(meta.extensions) == set(hc.get_server_metadata()["extensions"])
    for app in APPS:
        assert gc.is_model_ready(app)
        g, h = gc.get_model_metadata(app, as_json=True), hc.get_model_metadata(app)
        assert [o["name"] for o in g["outputs"]] == [o["name"] for o in h["outputs"]]
        assert g["inputs"][0]["name"] == "image"


@pytest.mark.parametrize("app", APPS)
def test_infer_every_app_over_grpc_and_http(gc, hc, app: str) -> None:
    outputs = [o["name"] for o in hc.get_model_metadata(app)["outputs"]]
    g = gc.infer(app, [_image(grpcclient)], request_id="g1")
    h = hc.infer(app, [_image(httpclient)], request_id="h1")
    assert g.get_response().id == "g1" and g.get_response().model_name == app
    for name in outputs:
        a, b = g.as_numpy(name), h.as_numpy(name)
        assert a is not None and b is not None and a.dtype == b.dtype and a.ndim == b.ndim
    params = g.get_response(as_json=True)["parameters"]
    assert params["emulated"]["bool_param"] is True and "e2e_us" in params


def test_typed_contents_and_raw_agree(node: ServerProcess) -> None:
    """A request with typed ``contents`` (no raw bytes) is read as the raw one is."""
    with grpc.insecure_channel(f"127.0.0.1:{node.grpc_port}") as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="traffic_analysis", id="typed")
        t = req.inputs.add(name="image", datatype="UINT8", shape=[4])
        t.contents.uint_contents.extend([1, 2, 3, 4])
        got = stub.ModelInfer(req, timeout=30)
        assert got.id == "typed" and len(got.raw_output_contents) == len(got.outputs)
        t.contents.uint_contents[:] = [1, 2, 3, 400]
        with pytest.raises(grpc.RpcError) as exc:
            stub.ModelInfer(req, timeout=30)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "inputs[0].contents: values out of range for UINT8" in exc.value.details()


def test_errors_carry_http_messages_and_grpc_codes(gc, hc) -> None:
    cases = [("nope", [_image(grpcclient)], {}, "StatusCode.NOT_FOUND", "unknown model 'nope'"),
             ("traffic_analysis", [grpcclient.InferInput("image", [2], "FP32")], {},
              "StatusCode.INVALID_ARGUMENT", "inputs[0].datatype: input 'image' expects UINT8"),
             ("traffic_analysis", [_image(grpcclient)], {"priority": 3}, "StatusCode.INVALID_ARGUMENT",
              "parameters.priority: 3 is not supported"),
             ("traffic_analysis", [_image(grpcclient)], {"timeout": 1}, "StatusCode.DEADLINE_EXCEEDED",
              "request dropped by task")]
    cases[1][1][0].set_data_from_numpy(np.zeros(2, np.float32))
    for model, inputs, kw, code, message in cases:
        with pytest.raises(InferenceServerException) as exc:
            gc.infer(model, inputs, **kw)
        assert _code(exc.value) == code and message in exc.value.message(), exc.value
    big = grpcclient.InferInput("image", [17 << 20], "UINT8")  # over server.max_payload_bytes (16 MiB)
    big.set_data_from_numpy(np.zeros(17 << 20, np.uint8))
    with pytest.raises(InferenceServerException) as exc:
        gc.infer("traffic_analysis", [big])
    assert _code(exc.value) == "StatusCode.RESOURCE_EXHAUSTED"
    with pytest.raises(InferenceServerException) as exc:  # HTTP: the same words
        hc.infer("traffic_analysis", [_image(httpclient)], priority=3)
    assert "parameters.priority: 3 is not supported" in exc.value.message()


def test_stream_answers_each_request_once(gc) -> None:
    got: queue.Queue = queue.Queue()
    gc.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for i in range(6):
            inputs = [_image(grpcclient)] if i != 3 else [grpcclient.InferInput("nope", [1], "UINT8")]
            if i == 3:
                inputs[0].set_data_from_numpy(np.zeros(1, np.uint8))
            gc.async_stream_infer("social_media", inputs, request_id=f"s{i}")
        answers = [got.get(timeout=30) for _ in range(6)]
    finally:
        gc.stop_stream()
    ok = sorted(r.get_response().id for r, e in answers if e is None)
    errors = [e for _, e in answers if e is not None]
    assert ok == ["s0", "s1", "s2", "s4", "s5"]
    assert len(errors) == 1 and "inputs[0].name: unknown input 'nope'" in errors[0].message()
    assert got.empty()


def test_statistics_per_task_agree_with_metrics(gc, hc, node: ServerProcess) -> None:
    for _ in range(3):
        gc.infer("traffic_analysis", [_image(grpcclient)])
    stats = gc.get_inference_statistics("traffic_analysis", as_json=True)["model_stats"]
    names = [s["name"] for s in stats]
    assert names == ["traffic_analysis", "traffic_analysis.detect", "traffic_analysis.car",
                     "traffic_analysis.person"]
    app, detect = stats[0], stats[1]
    ok = int(app["inference_stats"]["success"]["count"])
    assert ok >= 3 and int(app["inference_stats"]["success"]["ns"]) > 0
    for key in ("queue", "compute_input", "compute_infer"):
        assert int(detect["inference_stats"][key]["count"]) >= 3
    assert int(detect["inference_stats"]["compute_infer"]["ns"]) > 0
    assert int(detect["execution_count"]) >= 1 and detect["batch_stats"]
    # the all-models route, over HTTP: every app, the same count
    every = hc.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} >= set(APPS)
    mine = next(s for s in every if s["name"] == "traffic_analysis")
    assert mine["inference_stats"]["success"]["count"] == ok
    with urllib.request.urlopen(node.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'nv_inference_request_success_total{{model="traffic_analysis",version="1"}} {ok}.0' in text
    assert 'jigsaw_inference_request_success_total{app="traffic_analysis"}' in text
    with pytest.raises(InferenceServerException) as exc:
        gc.get_inference_statistics("nope")
    assert _code(exc.value) == "StatusCode.NOT_FOUND"


def test_model_config_is_an_ensemble_with_the_plan(gc, hc) -> None:
    h = hc.get_model_config("traffic_analysis")
    g = gc.get_model_config("traffic_analysis", as_json=True)["config"]
    assert h["platform"] == g["platform"] == "ensemble"
    steps = [s["model_name"] for s in g["ensemble_scheduling"]["step"]]
    assert steps == ["traffic_analysis.detect", "traffic_analysis.car", "traffic_analysis.person"]
    section = json.loads(g["parameters"]["jigsaw"]["string_value"])
    assert section == h["jigsaw"]
    assert section["plan"]["instances"] and {i["task"] for i in section["plan"]["instances"]} == \
        {"detect", "car", "person"}
    assert [e["to"] for e in section["edges"]] == ["car", "person"]


def test_kserve_numbered_load_request(node: ServerProcess) -> None:
    """KServe numbers the load request's model_name 1, Triton's repository_name: read as the name."""
    with grpc.insecure_channel(f"127.0.0.1:{node.grpc_port}") as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        kserve = pb.RepositoryModelLoadRequest(repository_name="traffic_analysis")
        stub.RepositoryModelLoad(kserve, timeout=30)
        with pytest.raises(grpc.RpcError) as exc:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(repository_name="nope"), timeout=30)
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def test_repository_index_load_unload(gc, hc) -> None:
    index = gc.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["state"]) for m in index} == {(a, "READY") for a in APPS}
    assert {m["name"] for m in hc.get_model_repository_index()} == set(APPS)
    gc.load_model("traffic_analysis")  # served already: nothing to do
    with pytest.raises(InferenceServerException) as exc:
        gc.unload_model("traffic_analysis")
    assert _code(exc.value) == "StatusCode.INVALID_ARGUMENT" and "static plans" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        hc.load_model("nope")
    assert "unknown model 'nope'" in exc.value.message()


def test_system_shared_memory_inputs_and_outputs(gc, hc) -> None:
    key = f"/jt-{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region("io", key, 4096)
    try:
        data = np.arange(16, dtype=np.uint8)
        shm.set_shared_memory_region(region, [data])
        gc.register_system_shared_memory("io", key, 4096)
        status = hc.get_system_shared_memory_status()
        assert [(r["name"], r["key"], int(r["byte_size"])) for r in status] == [("io", key, 4096)]
        x = grpcclient.InferInput("image", [16], "UINT8")
        x.set_shared_memory("io", 16)
        out = grpcclient.InferRequestedOutput("car.score")
        out.set_shared_memory("io", 2048, offset=1024)
        r = gc.infer("traffic_analysis", [x], outputs=[out])
        o = r.get_output("car.score")
        size = o.parameters["shared_memory_byte_size"].int64_param
        assert o.parameters["shared_memory_region"].string_param == "io" and size == 4 * int(np.prod(o.shape))
        scores = shm.get_contents_as_numpy(region, np.float32, list(o.shape), offset=1024)
        assert scores.shape == tuple(o.shape) and np.isfinite(scores).all()
        # HTTP reads the same input from the region and writes an output into it
        hx = httpclient.InferInput("image", [16], "UINT8")
        hx.set_shared_memory("io", 16)
        assert hc.infer("traffic_analysis", [hx]).as_numpy("car.score") is not None
        for binary in (False, True):
            hout = httpclient.InferRequestedOutput("person.score", binary_data=binary)
            hout.set_shared_memory("io", 1024, offset=3072)
            got = hc.infer("traffic_analysis", [hx], outputs=[hout]).get_output("person.score")
            assert got["parameters"]["shared_memory_region"] == "io" and "data" not in got
            n = int(np.prod(got["shape"]))
            assert got["parameters"]["shared_memory_byte_size"] == 4 * n
            assert np.isfinite(shm.get_contents_as_numpy(region, np.float32, [n], offset=3072)).all()
        # refused clearly: past the region, a second registration, a bad key, CUDA
        x.set_shared_memory("io", 16, offset=4090)
        with pytest.raises(InferenceServerException) as exc:
            gc.infer("traffic_analysis", [x])
        assert _code(exc.value) == "StatusCode.INVALID_ARGUMENT"
        assert "not within region 'io'" in exc.value.message()
        with pytest.raises(InferenceServerException, match="already registered"):
            gc.register_system_shared_memory("io", key, 16)
        for bad in ("../etc/passwd", "/a/b", f"/jigsaw-{os.getpid()}-x"):
            with pytest.raises(InferenceServerException) as exc:
                hc.register_system_shared_memory("bad", bad, 16)
            assert "key:" in exc.value.message()
        with pytest.raises(InferenceServerException) as exc:
            gc.get_cuda_shared_memory_status()
        assert _code(exc.value) == "StatusCode.UNIMPLEMENTED"
    finally:
        gc.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
    assert gc.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_world_readable_region_is_refused(gc) -> None:
    key = f"jt-{uuid.uuid4().hex[:8]}"
    path = Path("/dev/shm") / key
    path.write_bytes(b"\0" * 64)
    try:
        path.chmod(0o644)
        with pytest.raises(InferenceServerException) as exc:
            gc.register_system_shared_memory("open", "/" + key, 64)
        assert "accessible to no one else" in exc.value.message()
    finally:
        path.unlink()


def test_asyncio_clients(node: ServerProcess) -> None:
    """tritonclient's asyncio clients (gRPC and HTTP) against the same daemon."""
    import asyncio

    import tritonclient.grpc.aio as agrpc
    import tritonclient.http.aio as ahttp

    async def run() -> list[tuple[int, ...]]:
        g = agrpc.InferenceServerClient(f"127.0.0.1:{node.grpc_port}")
        h = ahttp.InferenceServerClient(f"127.0.0.1:{node.port}")
        try:
            assert await g.is_model_ready("ar_assistant") and await h.is_model_ready("ar_assistant")
            results = await asyncio.gather(*(g.infer("ar_assistant", [_image(agrpc)]) for _ in range(4)),
                                           h.infer("ar_assistant", [_image(ahttp)]))
            stats = await g.get_inference_statistics("ar_assistant", as_json=True)
            assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) >= 5
            return [r.as_numpy("speak.audio_samples").shape for r in results]
        finally:
            await g.close()
            await h.close()

    shapes = asyncio.run(run())
    assert len(shapes) == 5 and all(len(s) == 1 for s in shapes)
