"""The model repository: what a variant's ``model = "..."`` names, and the tensors it takes and gives.

A variant's model is one of:

- a **zoo name**: a built-in network (``resnet18``, ``yolov5s``, ``efficientnet-b0``, ``git-base``,
  ...; ``jigsaw.models.zoo``). The older ``family:arch`` spellings of the example apps
  (``torchvision:resnet18``, ``yolov5:s``) name the same networks; an empty ``model`` means the
  zoo network of the variant's own name;
- an **ONNX file**, ``path/to/model.onnx``, relative to the app file;
- a **model directory** in Triton's repository layout, relative to the app file::

      digits/                 # model = "models/digits"
        config.pbtxt          # optional; jigsaw reads max_batch_size and checks the platform
        1/model.onnx          # versions: the highest numbered one is served
        2/model.onnx

  (a directory holding ``model.onnx`` itself is accepted too).

The inputs, outputs, datatypes and shapes of an ONNX model are read from its graph (``onnx``,
without loading external weights). The first axis of every input and output is the batch axis;
the remaining ones are an item's shape (-1: any size). Reading never imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jigsaw.errors import JigsawError
from jigsaw.models.catalog import variant_info

ONNX_DATATYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
                  8: "BYTES", 9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64"}
"""ONNX ``TensorProto`` element types -> Open Inference Protocol datatypes."""

NUMPY_DTYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
                "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
                "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}

_LEGACY_FAMILIES = ("torchvision", "yolov5", "transformers", "tts")


class ModelError(JigsawError):
    """A model reference cannot be resolved or its file cannot be read (the message names it)."""


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a graph; ``shape`` includes the batch axis, -1 is a free size."""

    name: str
    datatype: str  # Open Inference Protocol datatype
    shape: tuple[int, ...]

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one item: the graph's shape without its batch axis."""
        return self.shape[1:]

    def describe(self) -> str:
        return f"{self.name!r} {self.datatype} {list(self.item_shape)}"


@dataclass(frozen=True)
class Model:
    """A resolved model: a zoo network or an ONNX file with the tensors read from its graph."""

    ref: str  # as the app file wrote it
    zoo: str = ""  # the zoo network's variant name (a built-in model)
    path: Path | None = None  # the ONNX file (a repository model)
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    max_batch_size: int = 0  # config.pbtxt's max_batch_size (0: not given)

    @property
    def is_onnx(self) -> bool:
        return self.path is not None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else f"zoo:{self.zoo}"

    def input(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorInfo | None:
        return next((t for t in self.outputs if t.name == name), None)


def zoo_name(ref: str, variant: str) -> str | None:
    """The zoo variant ``ref`` names (None when it names no built-in network)."""
    candidates: list[str] = []
    if not ref:
        candidates.append(variant)
    elif ":" in ref and ref.split(":", 1)[0] in _LEGACY_FAMILIES:
        family, arch = ref.split(":", 1)
        if family == "torchvision":
            candidates.append(arch.replace("_", "-"))
        elif family == "yolov5":
            candidates.append(f"yolov5{arch}")
        candidates.append(variant)  # transformers:/tts: references document the variant's network
    else:
        candidates.append(ref)
    for name in candidates:
        try:
            variant_info(name)
        except KeyError:
            continue
        return name
    return None


def _looks_like_path(ref: str) -> bool:
    if ":" in ref and ref.split(":", 1)[0] in _LEGACY_FAMILIES:
        return False
    return ref.endswith(".onnx") or "/" in ref or ref.startswith(".")


def resolve(ref: str, variant: str, base_dir: str | Path) -> Model:
    """The model ``ref`` names for ``variant``; paths are relative to ``base_dir`` (the app's folder).

    Raises ModelError saying what was expected; the caller adds the file and field.
    """
    base = Path(base_dir)
    if ref and (_looks_like_path(ref) or (":" not in ref and (base / ref).exists())):
        return load_path(base / ref, ref)
    name = zoo_name(ref, variant)
    if name is None:
        if not ref:
            raise ModelError(f"no model: the zoo has no network named {variant!r}; set model to a zoo "
                             "name, an ONNX file or a model directory (relative to the app file)")
        raise ModelError(f"{ref!r} is neither a zoo network nor a file or directory "
                         f"(looked for {base / ref})")
    return Model(ref, zoo=name)


def model_file(path: Path) -> tuple[Path, int]:
    """The ONNX file of a model file or directory, and the directory's max_batch_size (0: none)."""
    if path.is_file():
        return path, 0
    if not path.is_dir():
        raise ModelError(f"{path}: no such file or directory")
    max_batch = 0
    config = path / "config.pbtxt"
    if config.is_file():
        text = config.read_text(errors="replace")
        platform = re.search(r'^\s*(?:platform|backend)\s*:\s*"([^"]*)"', text, re.M)
        if platform and "onnx" not in platform.group(1):
            raise ModelError(f"{config}: platform {platform.group(1)!r}: jigsaw serves ONNX models "
                             "(onnxruntime_onnx)")
        m = re.search(r"^\s*max_batch_size\s*:\s*(\d+)", text, re.M)
        max_batch = int(m.group(1)) if m else 0
    if (path / "model.onnx").is_file():
        return path / "model.onnx", max_batch
    versions = sorted((int(d.name), d) for d in path.iterdir() if d.is_dir() and d.name.isdigit()
                      and (d / "model.onnx").is_file())
    if not versions:
        raise ModelError(f"{path}: a model directory holds model.onnx or <version>/model.onnx; "
                         "found neither")
    return versions[-1][1] / "model.onnx", max_batch


def _onnx() -> object:
    try:
        import onnx
    except ImportError:
        raise ModelError("reading ONNX models needs the onnx package "
                         "(pip install 'jigsaw[models]')") from None
    return onnx


def _tensor_info(value: object) -> TensorInfo:
    ttype = value.type.tensor_type  # type: ignore[attr-defined]
    datatype = ONNX_DATATYPES.get(ttype.elem_type, f"onnx-type-{ttype.elem_type}")
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                 for d in ttype.shape.dim)
    return TensorInfo(value.name, datatype, dims)  # type: ignore[attr-defined]


def load_path(path: Path, ref: str = "") -> Model:
    """A repository model from an ONNX file or a model directory, its tensors read from the graph."""
    onnx = _onnx()
    file, max_batch = model_file(path)
    try:
        proto = onnx.load(str(file), load_external_data=False)  # type: ignore[attr-defined]
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError ...
        raise ModelError(f"{file}: not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    inputs = tuple(_tensor_info(v) for v in graph.input if v.name not in initializers)
    outputs = tuple(_tensor_info(v) for v in graph.output)
    if not inputs or not outputs:
        raise ModelError(f"{file}: the graph has no {'inputs' if not inputs else 'outputs'}")
    for t in (*inputs, *outputs):
        if not t.shape:
            raise ModelError(f"{file}: tensor {t.name!r} is a scalar; jigsaw batches along a "
                             "leading batch axis")
        if t.datatype not in NUMPY_DTYPES:
            raise ModelError(f"{file}: tensor {t.name!r} has type {t.datatype}, which jigsaw does "
                             f"not batch (supported: {', '.join(NUMPY_DTYPES)})")
    return Model(ref or str(path), path=file.resolve(), inputs=inputs, outputs=outputs,
                 max_batch_size=max_batch)


def shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Same rank and equal wherever both sizes are fixed (-1 matches any size)."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


@dataclass(frozen=True)
class GraphCost:
    """What one item costs through an ONNX graph, as far as the graph tells (for modeled profiles)."""

    flops: float  # 2 per multiply-add of Conv, ConvTranspose, Gemm and MatMul
    params: int  # weights (initializer elements)
    nodes: int  # operations (each a kernel launch, unfused)
    activation_bytes_fp16: float  # every intermediate tensor at 2 bytes an element
    input_bytes: float  # the inputs as their datatypes


def onnx_flops(path: str | Path) -> float:
    """Floating-point operations of one item through an ONNX graph (see ``graph_cost``)."""
    return graph_cost(path).flops


def graph_cost(path: str | Path, item_shapes: dict[str, tuple[int, ...]] | None = None) -> GraphCost:
    """One item's cost through an ONNX graph.

    FLOPs count Conv, ConvTranspose, Gemm and MatMul (the operations that dominate a network's
    compute) from the shapes ONNX shape inference gives with the batch axis 1, an input named in
    ``item_shapes`` at that item shape (``app.concrete_item_shape``: a typical size), every other
    free axis 1; other operations are ignored. Used to model a new network's latency (``jigsaw modeled``).
    """
    onnx = _onnx()
    import numpy as np
    from onnx import numpy_helper, shape_inference
    proto = onnx.load(str(path))  # type: ignore[attr-defined]
    for value in proto.graph.input:
        item = (item_shapes or {}).get(value.name)
        for i, d in enumerate(value.type.tensor_type.shape.dim):
            if not (d.HasField("dim_value") and d.dim_value > 0):
                d.dim_value = item[i - 1] if item is not None and 0 < i <= len(item) else 1
    inferred = shape_inference.infer_shapes(proto)
    shapes: dict[str, tuple[int, ...]] = {}
    for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    params = 0
    initializers = set()
    for init in inferred.graph.initializer:
        shapes[init.name] = tuple(numpy_helper.to_array(init).shape)
        params += int(np.prod(shapes[init.name], dtype=np.int64))
        initializers.add(init.name)

    def prod(xs: tuple[int, ...]) -> int:
        n = 1
        for x in xs:
            n *= max(1, x)
        return n

    flops = 0.0
    for node in inferred.graph.node:
        out = shapes.get(node.output[0]) if node.output else None
        ins = [shapes.get(n) for n in node.input]
        if out is None or not ins or any(s is None for s in ins[:2]):
            continue
        if node.op_type in ("Conv", "ConvTranspose") and len(ins) >= 2:
            w = ins[1]
            assert w is not None
            per_out = prod(w[1:]) if node.op_type == "Conv" else prod(w[2:]) * w[0] // max(1, out[1])
            flops += 2.0 * prod(out) * per_out
        elif node.op_type in ("Gemm", "MatMul") and len(ins) >= 2:
            a = ins[0]
            assert a is not None
            k = a[-1] if node.op_type == "MatMul" or not any(
                at.name == "transA" and at.i for at in node.attribute) else a[0]
            flops += 2.0 * prod(out) * max(1, k)
    activations = sum(prod(shapes[v.name]) for v in inferred.graph.value_info if v.name in shapes)
    inputs = [v for v in inferred.graph.input if v.name not in initializers]
    input_bytes = sum(prod(shapes[v.name]) * np.dtype(NUMPY_DTYPES.get(
        ONNX_DATATYPES.get(v.type.tensor_type.elem_type, "FP32"), "float32")).itemsize for v in inputs)
    return GraphCost(flops, params, len(inferred.graph.node), 2.0 * activations, float(input_bytes))
