"""The model repository, edge transforms and a repository model's batches, without a server."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from jigsaw.app import load_app
from jigsaw.backends.base import Downstream
from jigsaw.backends.graph_pipeline import GraphPipeline
from jigsaw.errors import ConfigError
from jigsaw.models.check import ModelLoadError, check_models
from jigsaw.models.repository import ModelError, load_path, onnx_flops, resolve
from jigsaw.models.transforms import TransformError, load
from jigsaw.tensors import decode_tensors, encode_tensors

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def tiny_onnx(path: Path, *, n_in: int = 4, n_out: int = 3, in_name: str = "x", out_name: str = "y",
              elem: int = 1, op: str = "MatMul") -> Path:
    """x [batch, n_in] @ W [n_in, n_out] -> y [batch, n_out] (or an op onnxruntime does not know)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.arange(n_in * n_out, dtype=np.float32).reshape(n_in, n_out) / 10, "W")
    domain = {"domain": "no.such"} if op != "MatMul" else {}
    node = helper.make_node(op, [in_name, "W"], [out_name], **domain)
    graph = helper.make_graph([node], "tiny", [helper.make_tensor_value_info(in_name, elem, ["batch", n_in])],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", n_out])],
                              [w])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("no.such", 1)] if op != "MatMul" else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_app(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "app.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_a_model_is_a_zoo_name_a_file_or_a_triton_directory(tmp_path: Path) -> None:
    assert resolve("", "resnet18", tmp_path).zoo == "resnet18"
    assert resolve("torchvision:efficientnet_b0", "anything", tmp_path).zoo == "efficientnet-b0"
    assert resolve("yolov5:s", "det", tmp_path).zoo == "yolov5s"
    assert resolve("vgg11", "mine", tmp_path).zoo == "vgg11"
    f = tiny_onnx(tmp_path / "m.onnx")
    m = resolve("m.onnx", "v", tmp_path)
    assert m.path == f.resolve()
    assert [(t.name, t.datatype, t.shape) for t in m.inputs] == [("x", "FP32", (-1, 4))]
    assert [(t.name, t.datatype, t.item_shape) for t in m.outputs] == [("y", "FP32", (3,))]
    # Triton layout: the highest version; config.pbtxt's max_batch_size
    tiny_onnx(tmp_path / "repo" / "net" / "1" / "model.onnx", n_out=2)
    tiny_onnx(tmp_path / "repo" / "net" / "3" / "model.onnx", n_out=5)
    config = tmp_path / "repo" / "net" / "config.pbtxt"
    config.write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 16\n')
    d = resolve("repo/net", "v", tmp_path)
    assert d.path is not None and d.path.parent.name == "3" and d.outputs[0].item_shape == (5,)
    assert d.max_batch_size == 16
    (tmp_path / "repo" / "net" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\n')
    with pytest.raises(ModelError, match="tensorflow_savedmodel"):
        resolve("repo/net", "v", tmp_path)
    with pytest.raises(ModelError, match="no model"):
        resolve("", "lenet-1", tmp_path)
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        load_path(tmp_path / "junk.onnx")


def test_flops_are_read_from_the_graph(tmp_path: Path) -> None:
    assert onnx_flops(tiny_onnx(tmp_path / "m.onnx", n_in=4, n_out=3)) == 2 * 4 * 3


APP = """
name = "two"
latency_slo_ms = 100
[[inputs]]
name = "x"
datatype = "FP32"
shape = [4]
[[tasks]]
name = "a"
variants = [{ name = "net", accuracy = 1.0, model = "m.onnx" }]
[[tasks]]
name = "b"
variants = [{ name = "net2", accuracy = 1.0, model = "m2.onnx" }]
[[edges]]
from = "a"
to = "b"
"""


def test_declared_tensors_are_checked_against_the_graphs(tmp_path: Path) -> None:
    tiny_onnx(tmp_path / "m.onnx", n_in=4, n_out=4)
    tiny_onnx(tmp_path / "m2.onnx", n_in=4, n_out=2)
    app = load_app(write_app(tmp_path, APP))
    assert app.task("b").variants[0].resolved.outputs[0].item_shape == (2,)  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as err:
        load_app(write_app(tmp_path, APP.replace("shape = [4]", "shape = [5]")))
    assert err.value.field == "tasks[0].variants[0].model" and "m.onnx" in err.value.message
    with pytest.raises(ConfigError) as err:
        load_app(write_app(tmp_path, APP.replace('datatype = "FP32"', 'datatype = "BYTES"')))
    assert err.value.field == "tasks[0].variants[0].model"
    tiny_onnx(tmp_path / "m2.onnx", n_in=3, n_out=2)  # a's 4 outputs cannot feed b's 3 inputs
    with pytest.raises(ConfigError) as err:
        load_app(write_app(tmp_path, APP))
    assert err.value.field == "edges[0]" and "m2.onnx" in err.value.message
    assert "transform" in err.value.message
    app = load_app(write_app(tmp_path, APP + 'transform = "edge_fn:reshape"\n'))  # a transform: not checked
    assert app.edges[0].transform == "edge_fn:reshape"
    without_inputs = APP.split("[[tasks]]", 1)[1]
    app = load_app(write_app(tmp_path, 'name = "x"\nlatency_slo_ms = 10\n[[tasks]]' + without_inputs
                             + 'transform = "edge_fn:reshape"\n'))
    assert [(i.name, i.datatype, i.shape) for i in app.inputs] == [("x", "FP32", (4,))]


def _payload(**tensors: np.ndarray) -> bytes:
    return bytes(encode_tensors([(k, "FP32", v.shape, v) for k, v in tensors.items()]))


def test_a_transform_makes_0_to_n_children_and_a_bad_one_fails_its_item_alone(tmp_path: Path) -> None:
    (tmp_path / "fans.py").write_text(textwrap.dedent("""
        import numpy as np
        def fan(inputs, outputs, edge):
            n = int(inputs["x"].reshape(-1)[0])
            if n < 0:
                raise RuntimeError("negative fan-out")
            if n == 9:
                return "not a list"
            return [{"x": outputs["y"] * k} for k in range(n)]
    """))
    model = load_path(tiny_onnx(tmp_path / "m.onnx", n_in=4, n_out=4))
    pipe = GraphPipeline(model, "a", [Downstream("b", 1.0, "fans:fan", str(tmp_path))])
    session = ort.InferenceSession(str(model.path))
    items = [np.array([n, 1, 2, 3], np.float32) for n in (0, 2, -1, 9, 3)]
    results = pipe.execute([_payload(x=x) for x in items], lambda feeds: session.run(None, feeds))
    want = session.run(None, {"x": np.stack(items)})[0]
    assert [len(r.children.get("b", [])) for r in results] == [0, 2, 0, 0, 3]
    assert not results[0].error and not results[1].error and not results[4].error
    assert "negative fan-out" in results[2].error and "fans:fan" in results[2].error
    assert "expected a list" in results[3].error
    np.testing.assert_allclose(results[1].outputs[0].data, want[1:2], rtol=1e-6)
    child = {t.name: np.asarray(t.data) for t in decode_tensors(results[4].children["b"][2])}
    np.testing.assert_allclose(child["x"], want[4:5] * 2, rtol=1e-6)
    sink = GraphPipeline(model, "a")
    bad = sink.execute([_payload(z=np.ones(4, np.float32)), _payload(x=np.zeros(5, np.float32))],
                       lambda feeds: session.run(None, feeds))
    assert "shape [4]" in bad[1].error
    assert not bad[0].error  # a one-input graph takes an item's only tensor whatever its name
    want_ones = session.run(None, {"x": np.ones((1, 4), np.float32)})[0]
    np.testing.assert_allclose(bad[0].outputs[0].data, want_ones)


def test_transforms_load_from_the_app_folder_with_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text("def f(i, o, e):\n    return []\nX = 3\n")
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    assert load("good:f", tmp_path)({}, {}, None) == []  # type: ignore[arg-type]
    with pytest.raises(TransformError, match="no_such_module_anywhere"):
        load("broken:f", tmp_path)
    with pytest.raises(TransformError, match="has no 'g'"):
        load("good:g", tmp_path)
    with pytest.raises(TransformError, match="not a function"):
        load("good:X", tmp_path)
    with pytest.raises(TransformError, match="module:function"):
        load("good.f", tmp_path)
    assert load("jigsaw.models.transforms:crop_detections") is not None  # the built-in crops


def test_models_and_transforms_are_checked_before_serving(tmp_path: Path) -> None:
    tiny_onnx(tmp_path / "m.onnx", n_in=4, n_out=4)
    tiny_onnx(tmp_path / "m2.onnx", n_in=4, n_out=2)
    (tmp_path / "edge_fn.py").write_text("def reshape(i, o, e):\n    return [o]\n")
    app = load_app(write_app(tmp_path, APP))
    check_models([app], "onnxruntime")
    with pytest.raises(ModelLoadError, match="torch backend runs zoo networks only"):
        check_models([app], "torch")
    tiny_onnx(tmp_path / "m2.onnx", n_in=4, n_out=2, op="NoSuchOp")  # onnx reads it, onnxruntime cannot
    with pytest.raises(ModelLoadError) as err:
        check_models([load_app(write_app(tmp_path, APP))], "onnxruntime")
    assert "variant 'net2'" in str(err.value) and "m2.onnx" in str(err.value)
    tiny_onnx(tmp_path / "m2.onnx", n_in=4, n_out=2)
    with pytest.raises(ModelLoadError, match=r"edge a -> b.*cannot import 'nope'"):
        check_models([load_app(write_app(tmp_path, APP + 'transform = "nope:f"\n'))], "onnxruntime")
    check_models([load_app(write_app(tmp_path, APP + 'transform = "edge_fn:reshape"\n'))], "onnxruntime")
    no_model = APP.replace(', model = "m.onnx"', "").replace('name = "net",', 'name = "lenet-1",')
    with pytest.raises(ModelLoadError, match="variant 'lenet-1': no model"):
        check_models([load_app(write_app(tmp_path, no_model))], "onnxruntime")
    check_models([load_app(write_app(tmp_path, no_model))], "emulated")


def test_one_variant_serves_six_tasks_each_planned_its_own_instances(tmp_path: Path) -> None:
    """The game app of the issue: six digit classifiers on one frame share one model and one
    profile table; the planner gives each task its own instances."""
    import json
    import subprocess
    import sys

    from jigsaw.profile_import import import_csv
    tiny_onnx(tmp_path / "lenet.onnx", n_in=4, n_out=10)
    tasks = "".join(f'[[tasks]]\nname = "digit{i}"\nvariants = [{{ name = "lenet", accuracy = 99.0'
                    + (', model = "lenet.onnx"' if i == 1 else "") + " }]\n" for i in range(1, 7))
    (tmp_path / "game.toml").write_text(f'name = "game"\nlatency_slo_ms = 95\n{tasks}')
    (tmp_path / "node.toml").write_text(textwrap.dedent("""
        apps = ["game.toml"]
        [gpus]
        model = "A100-80GB"
        mig = false
        count = 8
        mps_levels = [1, 2]
        batch_sizes = [1, 8]
        profiles_dir = "profiles"
        backend = "emulated"
    """))
    (tmp_path / "lenet.csv").write_text("model,hardware,batch,mps,p95,unit,throughput,memory_mb\n"
                                        "lenet,gpu,1,1,1.0,ms,900,500\nlenet,gpu,8,1,2.0,ms,3800,520\n"
                                        "lenet,gpu,1,2,1.5,ms,1300,500\nlenet,gpu,8,2,3.0,ms,5000,520\n")
    import_csv(tmp_path / "lenet.csv", tmp_path / "profiles", say=lambda _: None)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--app", "game", "--node",
                           str(tmp_path / "node.toml"), "--demand", "1000", "--json"], capture_output=True,
                          text=True, env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["feasible"]
    assert {i["task"] for i in plan["instances"]} == {f"digit{i}" for i in range(1, 7)}
    assert {i["variant"] for i in plan["instances"]} == {"lenet"}
