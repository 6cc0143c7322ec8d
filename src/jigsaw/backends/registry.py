"""The one table of model backends: name -> class, and what the rest of the node needs to know.

Adding a backend is one ``BackendKind`` row here and its class; nothing else compares backend
names. Classes load lazily (by module path) so the node configuration, the frontend and the CLI
can ask about a backend without importing torch, onnxruntime or TensorRT. This module imports
nothing from ``jigsaw`` at load time: it is vocabulary, usable from every layer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jigsaw.app import App
    from jigsaw.backends.base import Backend, OutputSpec


class BackendUnavailable(RuntimeError):
    """The backend's libraries are not installed in this environment (the ``models`` extra)."""


@dataclass(frozen=True)
class BackendKind:
    """One backend: where its class lives and how the node runs it."""

    name: str
    class_path: str  # "module:Class", imported on first use
    output_specs_path: str  # "module:function" giving a task kind's per-item outputs
    task_specs_path: str = ""  # "module:function" giving an app task's outputs (its models'); "": by kind
    emulated: bool = False  # its results are labelled emulated (responses, metrics, logs)
    runs_models: bool = True  # loads real networks (needs the models extra, profiles real rows)
    needs_gpu: bool = False  # only serves with a usable CUDA device (else: a CPU node's backend)
    gpu_capable: bool = False  # on a GPU node its workers run on the GPUs, pinned like a GPU backend's
    libraries: tuple[str, ...] = ()  # whose versions a profile row records
    onnx_opener: str = ""  # "module:function" opening an ONNX file as this backend will ("": zoo only)

    def on_gpus(self, gpu_kind: str) -> bool:
        """Whether its workers run on the node's GPUs (each pinned by ``CUDA_VISIBLE_DEVICES`` to
        its MIG instance or GPU, MIG partitions and MPS daemons made for them) on a node whose
        ``[gpu]`` kind is ``gpu_kind`` ("cpu" for a CPU node)."""
        return self.needs_gpu or (self.gpu_capable and gpu_kind != "cpu")

    def load_class(self) -> type[Backend]:
        """The backend class; ``BackendUnavailable`` when its libraries are missing."""
        try:
            return _resolve(self.class_path)  # type: ignore[no-any-return]
        except ImportError as exc:
            raise BackendUnavailable(f"backend {self.name!r} needs the models extra "
                                     f"(pip install 'jigsaw[models]'): {exc}") from None

    def output_specs(self, task_kind: str, downstream: Sequence[str] = ()) -> list[OutputSpec]:
        """The outputs one item of a task of ``task_kind`` produces on this backend."""
        fn: Callable[[str, Sequence[str]], list[OutputSpec]] = _resolve(self.output_specs_path)
        return fn(task_kind, downstream)

    def task_output_specs(self, app: App, task: str) -> list[OutputSpec]:
        """The outputs one item of ``app``'s ``task`` produces: a repository model's graph outputs
        where this backend runs the model, else those of the task's kind."""
        if not self.task_specs_path:
            return self.output_specs(app.task(task).kind, app.children(task))
        fn: Callable[[App, str], list[OutputSpec]] = _resolve(self.task_specs_path)  # type: ignore[assignment]
        return fn(app, task)


_REAL_SPECS = "jigsaw.backends.pipeline:output_specs"
_TASK_SPECS = "jigsaw.backends.pipeline:task_output_specs"

KINDS: dict[str, BackendKind] = {k.name: k for k in (
    # (the real backends' outputs: emulation answers with the same names, ``backends/emulated.py``)
    BackendKind("emulated", "jigsaw.backends.emulated:EmulatedBackend", _REAL_SPECS, _TASK_SPECS,
                emulated=True, runs_models=False),
    BackendKind("tensorrt", "jigsaw.backends.tensorrt_backend:TensorRTBackend", _REAL_SPECS, _TASK_SPECS,
                needs_gpu=True, gpu_capable=True, libraries=("tensorrt", "torch"),
                onnx_opener="jigsaw.models.check:check_onnx_graph"),
    BackendKind("onnxruntime", "jigsaw.backends.onnxruntime_backend:OnnxRuntimeBackend",
                _REAL_SPECS, _TASK_SPECS,
                libraries=("onnxruntime", "torch"), onnx_opener="jigsaw.models.check:open_onnxruntime"),
    BackendKind("torch", "jigsaw.backends.torch_backend:TorchBackend", _REAL_SPECS, _TASK_SPECS,
                gpu_capable=True, libraries=("torch",)),
)}
NAMES: tuple[str, ...] = tuple(KINDS)
MODEL_BACKENDS: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.runs_models)
ONNX_BACKENDS: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.onnx_opener)  # run repository models
EMULATED = "emulated"  # the backend ``--emulate`` selects


def backend_kind(name: str) -> BackendKind:
    """The registry row of ``name``; ``KeyError`` naming the known backends otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(NAMES)})") from None


def open_onnx(kind: BackendKind, path: str) -> None:
    """Open the ONNX file at ``path`` the way ``kind`` will (raises what its runtime raises)."""
    opener: Callable[[str], object] = _resolve(kind.onnx_opener)  # type: ignore[assignment]
    opener(path)


def _resolve(path: str) -> object:
    module, _, attr = path.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
