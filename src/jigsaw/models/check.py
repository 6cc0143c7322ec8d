"""Before serving: can every worker of a node load its model, and every edge its transform?

A worker that cannot load its model would fail after the daemon started serving, once per
restart; this check finds it first, in the daemon's process, and names the app, the variant and
the file. One app's problem is that app's only: ``jigsawd`` serves the others and answers the
app's readiness 503 with the reason. A repository model is opened the way its backend will open
it (an onnxruntime session; the ONNX checker for TensorRT, which builds on the GPU); a zoo network
must exist in the zoo.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from jigsaw.app import App
from jigsaw.backends.registry import ONNX_BACKENDS, BackendKind, backend_kind, open_onnx
from jigsaw.errors import JigsawError
from jigsaw.models import transforms


class ModelLoadError(JigsawError):
    """A variant's model or an edge's transform cannot be loaded (the message names which)."""


def check_models(apps: Iterable[App], backend: str) -> None:
    """Raises ModelLoadError for the first model or transform of ``apps`` that ``backend`` cannot load."""
    for why in app_problems(apps, backend).values():
        raise ModelLoadError(why)


def app_problems(apps: Iterable[App], backend: str) -> dict[str, str]:
    """app name -> why ``backend`` cannot load one of its models or transforms (the first found),
    for each app that has such a problem: the node serves the others (``jigsawd``), and
    ``jigsaw check`` runs the same check."""
    kind = backend_kind(backend)
    opened: dict[str, str] = {}  # an ONNX file -> why it cannot be opened ("": it can), once each
    problems = {}
    for app in apps:
        why = _app_problem(app, kind, opened)
        if why:
            problems[app.name] = why
    return problems


def _app_problem(app: App, kind: BackendKind, opened: dict[str, str]) -> str:
    """Why ``kind`` cannot load one of ``app``'s models or transforms ("" when it can; the emulated
    backend loads neither)."""
    if not kind.runs_models:
        return ""
    for task in app.tasks:
        for v in task.variants:
            where = f"{app.source}: task {task.name!r}, variant {v.name!r}"
            model = v.resolved
            if model is None:
                return (f"{where}: no model: the zoo has no network named {v.name!r}; "
                        "set model to a zoo name, an ONNX file or a model directory")
            if not model.is_onnx:
                continue
            key = str(model.path)
            if key not in opened:
                opened[key] = _open(model.path, kind)  # type: ignore[arg-type]
            if opened[key]:
                return f"{where}: cannot load {model.path}: {opened[key]}"
    base = Path(app.source).parent if app.source else None
    for e in app.edges:
        if e.transform:
            try:
                transforms.load(e.transform, base)
            except transforms.TransformError as exc:
                return f"{app.source}: edge {e.src} -> {e.dst}: {exc}"
    return ""


def _open(path: Path, kind: BackendKind) -> str:
    """Why backend ``kind`` cannot open the ONNX file ("" when it can)."""
    if not kind.onnx_opener:
        return f"the {kind.name} backend runs zoo networks only; use {' or '.join(ONNX_BACKENDS)}"
    try:
        open_onnx(kind, str(path))
    except ImportError as exc:
        return f"the {kind.name} backend needs the models extra (pip install 'jigsaw[models]'): {exc}"
    except Exception as exc:  # the runtimes raise their own exception types
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return ""


def open_onnxruntime(path: str) -> None:
    """Open ``path`` in an onnxruntime session (the onnxruntime backend's check)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def check_onnx_graph(path: str) -> None:
    """Run the ONNX checker on ``path`` (TensorRT builds its engine on the GPU, in the worker)."""
    import onnx
    onnx.checker.check_model(path)
