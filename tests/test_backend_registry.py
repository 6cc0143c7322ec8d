"""The backend registry is the one place that knows backends by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from jigsaw.backends.base import Backend
from jigsaw.backends.emulated import EmulatedBackend
from jigsaw.backends.registry import (
    KINDS,
    MODEL_BACKENDS,
    NAMES,
    ONNX_BACKENDS,
    BackendUnavailable,
    backend_kind,
    open_onnx,
)
from jigsaw.daemon import choose_backend, gpu_available
from jigsaw.errors import JigsawError
from jigsaw.node import BACKENDS

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", NAMES)
def test_every_row_names_its_class(name: str) -> None:
    try:
        cls = backend_kind(name).load_class()
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    assert issubclass(cls, Backend) and cls.kind == name


def test_names_and_their_properties() -> None:
    assert BACKENDS == NAMES  # the node file accepts exactly the registry's backends
    assert [n for n, k in KINDS.items() if k.emulated] == ["emulated"]
    assert "emulated" not in MODEL_BACKENDS and set(MODEL_BACKENDS) == set(NAMES) - {"emulated"}
    assert [n for n, k in KINDS.items() if k.needs_gpu] == ["tensorrt"]
    assert set(ONNX_BACKENDS) == {"onnxruntime", "tensorrt"}  # torch runs zoo networks only
    with pytest.raises(KeyError, match=r"unknown backend 'nope'.*emulated"):
        backend_kind("nope")


def test_output_specs_come_from_the_backend() -> None:
    assert backend_kind("emulated").output_specs("detector", ["car"]) == \
        EmulatedBackend.output_specs("detector", ["car"])
    real = backend_kind("onnxruntime").output_specs("detector", ["car"])
    assert [s.name for s in real][:2] == ["num_boxes", "num_car"]


def test_jigsawd_chooses_the_backend_by_the_registry() -> None:
    assert choose_backend(EXAMPLES / "h100x4.toml", emulate=True).name == "emulated"
    assert choose_backend(EXAMPLES / "cpu.toml", emulate=False).name == "onnxruntime"
    if not gpu_available():
        with pytest.raises(JigsawError, match=r"'tensorrt' needs a GPU.*--emulate"):
            choose_backend(EXAMPLES / "h100x4.toml", emulate=False)


@pytest.mark.parametrize("name", ONNX_BACKENDS)
def test_the_onnx_openers_reject_a_file_that_is_not_a_graph(name: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf")
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        pytest.skip(str(exc))
    with pytest.raises(Exception):  # noqa: B017  (each runtime raises its own type)
        open_onnx(backend_kind(name), str(bad))


@pytest.mark.parametrize(("backend", "gpu_kind", "pinned"), [
    ("torch", "gpu", True), ("tensorrt", "gpu", True), ("torch", "cpu", False), ("onnxruntime", "gpu", False),
])
def test_gpu_workers_are_pinned_to_their_gpu_whatever_the_gpu_backend(
        monkeypatch: pytest.MonkeyPatch, backend: str, gpu_kind: str, pinned: bool) -> None:
    """torch on a GPU node is a GPU backend: each worker sees only its GPU (or MIG instance), as
    TensorRT's do; on a CPU node it is a CPU backend."""
    from types import SimpleNamespace

    from jigsaw.plan import GpuLayout, Layout, PlacedInstance
    from jigsaw.runtime import generation

    kind = backend_kind(backend)
    assert kind.on_gpus(gpu_kind) == pinned
    monkeypatch.setattr(generation, "host_devices", lambda node: {(0, 0): "GPU-aaa", (1, 0): "GPU-bbb"})
    layout = Layout("H200", (GpuLayout(0, (PlacedInstance("whole", 0, "car", "efficientnet-b0", 0, 1, 32),)),
                             GpuLayout(1, (PlacedInstance("whole", 0, "car", "efficientnet-b0", 1, 1, 32),))))
    procs = [SimpleNamespace(task="car", variant="efficientnet-b0", mig_profile="whole", mps=1, max_batch=32)
             for _ in range(2)]
    gen = SimpleNamespace(topology=SimpleNamespace(processes=procs), backend=kind,
                          node=SimpleNamespace(gpu=SimpleNamespace(kind=gpu_kind, mig=False)),
                          plan=SimpleNamespace(layout=layout if gpu_kind == "gpu" else None),
                          _cpu_envs=lambda: [None, None])
    envs = generation.Generation._worker_envs(gen)  # type: ignore[arg-type]
    if pinned:
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["GPU-aaa", "GPU-bbb"]
    else:
        assert envs == [None, None]
