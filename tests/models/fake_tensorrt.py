"""A stand-in for the ``tensorrt`` module that keeps TensorRT 10's rules for building and binding.

It builds "engines" from ONNX files (the serialized engine carries the ONNX bytes and the
optimization profile) and runs them with onnxruntime on host memory, read and written through the
raw addresses bound with ``set_tensor_address`` (so a binding must really point at the data).
The rules it enforces, as TensorRT does: input shapes are set before output shapes are asked for
and lie within the profile (else ``set_input_shape`` returns False); every I/O tensor has a
non-null address aligned to its dtype before ``execute_async_v3``; the stream is an integer
handle; each I/O tensor's dtype is the graph's.
"""

from __future__ import annotations

import ctypes
import json
from enum import Enum
from typing import Any

import numpy as np

__version__ = "10.fake"


class TensorIOMode(Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(Enum):
    FLOAT = "float32"
    HALF = "float16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"


def nptype(dt: DataType) -> type:
    return np.dtype(dt.value).type


class Logger:
    WARNING = 2

    def __init__(self, level: int = 2) -> None:
        self.level = level


class BuilderFlag(Enum):
    FP16 = 1


class MemoryPoolType(Enum):
    WORKSPACE = 0


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise ValueError(f"profile of {name}: min <= opt <= max violated")
        self.shapes[name] = [list(lo), list(opt), list(hi)]


class _Config:
    def __init__(self) -> None:
        self.profiles: list[_Profile] = []
        self.flags: set[BuilderFlag] = set()

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        pass

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def add_optimization_profile(self, p: _Profile) -> int:
        self.profiles.append(p)
        return len(self.profiles) - 1


class _Network:
    onnx: bytes = b""


class Builder:
    builds = 0  # engines built in this process (a cached engine is loaded, not built)

    def __init__(self, logger: Logger) -> None:
        pass

    def create_network(self, flags: int = 0) -> _Network:
        return _Network()

    def create_builder_config(self) -> _Config:
        return _Config()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: _Config) -> bytes:
        import onnx
        model = onnx.load_from_string(network.onnx)
        (profile,) = config.profiles
        names = [i.name for i in model.graph.input]
        if set(profile.shapes) != set(names):
            raise ValueError(f"a profile must cover every input: {names}, got {sorted(profile.shapes)}")
        Builder.builds += 1
        head = json.dumps({"profile": profile.shapes}).encode()
        return len(head).to_bytes(4, "little") + head + network.onnx


class OnnxParser:
    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network
        self.num_errors = 0

    def parse(self, data: bytes) -> bool:
        self.network.onnx = data
        return True

    def get_error(self, i: int) -> str:
        return ""


_ONNX_TYPES = {1: DataType.FLOAT, 10: DataType.HALF, 6: DataType.INT32, 7: DataType.INT64, 9: DataType.BOOL}


class _Engine:
    def __init__(self, blob: bytes) -> None:
        import onnx
        import onnxruntime as ort
        n = int.from_bytes(blob[:4], "little")
        self.profile = {k: [tuple(s) for s in v] for k, v in json.loads(blob[4:4 + n])["profile"].items()}
        data = blob[4 + n:]
        model = onnx.load_from_string(data)
        self.session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        self.io: list[tuple[str, TensorIOMode, DataType, list[int | str]]] = []
        self._shapes: dict[Any, dict[str, tuple[int, ...]]] = {}
        graph = model.graph
        for mode, values in ((TensorIOMode.INPUT, graph.input), (TensorIOMode.OUTPUT, graph.output)):
            for v in values:
                t = v.type.tensor_type
                dims: list[int | str] = [d.dim_param or d.dim_value for d in t.shape.dim]
                self.io.append((v.name, mode, _ONNX_TYPES[t.elem_type], dims))

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, i: int) -> str:
        return self.io[i][0]

    def _entry(self, name: str) -> tuple[str, TensorIOMode, DataType, list[int | str]]:
        for e in self.io:
            if e[0] == name:
                return e
        raise KeyError(f"no tensor {name!r}")

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self._entry(name)[1]

    def get_tensor_dtype(self, name: str) -> DataType:
        return self._entry(name)[2]

    def output_shapes(self, inputs: tuple[tuple[str, tuple[int, ...], DataType], ...]
                      ) -> dict[str, tuple[int, ...]]:
        """Every output's shape for these input shapes (TensorRT infers them from the network;
        here the graph runs once on zeros per distinct set of input shapes)."""
        key = tuple((n, s) for n, s, _ in inputs)
        if key not in self._shapes:
            outs = self.session.run(None, {n: np.zeros(s, np.dtype(dt.value)) for n, s, dt in inputs})
            names = [e[0] for e in self.io if e[1] == TensorIOMode.OUTPUT]
            self._shapes[key] = {n: tuple(o.shape) for n, o in zip(names, outs)}
        return self._shapes[key]

    def create_execution_context(self) -> _Context:
        return _Context(self)


class Runtime:
    def __init__(self, logger: Logger) -> None:
        pass

    def deserialize_cuda_engine(self, blob: bytes) -> _Engine:
        return _Engine(bytes(blob))


class _Context:
    executions = 0

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    def set_input_shape(self, name: str, shape: Any) -> bool:
        if self.engine.get_tensor_mode(name) != TensorIOMode.INPUT:
            return False
        lo, _, hi = self.engine.profile[name]
        shape = tuple(int(s) for s in shape)
        if len(shape) != len(lo) or not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        self.shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        _, mode, _, dims = self.engine._entry(name)
        if mode == TensorIOMode.INPUT:
            return self.shapes.get(name, tuple(-1 if isinstance(d, str) else d for d in dims))
        inputs = [e for e in self.engine.io if e[1] == TensorIOMode.INPUT]
        if any(e[0] not in self.shapes for e in inputs):
            return tuple(-1 if isinstance(d, str) else d for d in dims)
        return self.engine.output_shapes(tuple((e[0], self.shapes[e[0]], e[2]) for e in inputs))[name]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.engine._entry(name)
        self.addresses[name] = int(ptr)
        return True

    def execute_async_v3(self, stream: int) -> bool:
        if not isinstance(stream, int):
            raise TypeError(f"execute_async_v3 takes a stream handle (int), got {type(stream).__name__}")
        feeds = {}
        for name, mode, dt, _ in self.engine.io:
            ptr = self.addresses.get(name, 0)
            if not ptr or ptr % np.dtype(dt.value).itemsize:
                return False  # TensorRT: an unbound or misaligned tensor fails the enqueue
            if mode == TensorIOMode.INPUT:
                if name not in self.shapes:
                    return False
                feeds[name] = _read(ptr, self.shapes[name], dt)
        outs = self.engine.session.run(None, feeds)
        outputs = [e for e in self.engine.io if e[1] == TensorIOMode.OUTPUT]
        for (name, _, dt, _), value in zip(outputs, outs):
            want = self.get_tensor_shape(name)
            if tuple(value.shape) != want:
                raise AssertionError(f"output {name}: {value.shape} vs {want}")
            arr = np.ascontiguousarray(value, np.dtype(dt.value))
            ctypes.memmove(self.addresses[name], arr.ctypes.data, arr.nbytes)
        _Context.executions += 1
        return True


def _read(ptr: int, shape: tuple[int, ...], dt: DataType) -> np.ndarray:
    dtype = np.dtype(dt.value)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(ptr), dtype).reshape(shape).copy()
