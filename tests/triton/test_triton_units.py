"""The Triton surface's pure parts: shared-memory rules, the gRPC codec, error codes, statistics."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest

pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2 as pb

from jigsaw.app import App, Task, TensorSpec, Variant
from jigsaw.runtime import model_stats as ms
from jigsaw.runtime.grpc_codec import encode_grpc_response, parse_grpc_request
from jigsaw.runtime.grpc_server import code_of
from jigsaw.runtime.oip import BadRequest
from jigsaw.runtime.shm_regions import SharedMemoryRegions, ShmError
from jigsaw.testing import SRC, free_port

ROOT = Path(__file__).resolve().parents[2]
APP = App("a", (Task("t", "generic", (Variant("v", 1.0),)),), (), 100.0,
          inputs=(TensorSpec("image", "UINT8", (-1,)), TensorSpec("text", "BYTES", (-1,))))


@pytest.fixture
def region() -> tuple[str, Path]:
    key = f"jt-{uuid.uuid4().hex[:8]}"
    path = Path("/dev/shm") / key
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 256)
    os.close(fd)
    yield "/" + key, path
    path.unlink(missing_ok=True)


def test_shm_regions_are_checked(region: tuple[str, Path]) -> None:
    key, path = region
    shm = SharedMemoryRegions()
    for bad in ("", "a/b", "/../x", "..", "/jigsaw-1-rings", "sem.jigsaw-1-x", "x" * 300):
        with pytest.raises(ShmError, match="key:"):
            shm.register("r", bad, 0, 16)
    with pytest.raises(ShmError, match="not within the 256 bytes"):
        shm.register("r", key, 200, 100)
    with pytest.raises(ShmError, match="no shared memory object"):
        shm.register("r", "/jt-none-" + uuid.uuid4().hex, 0, 16)
    shm.register("r", key, 64, 128)
    assert shm.status() == [{"name": "r", "key": key, "offset": 64, "byte_size": 128}]
    shm.write("r", 8, 4, b"\x01\x02\x03\x04")
    assert path.read_bytes()[72:76] == b"\x01\x02\x03\x04"  # region offset 64 + 8
    assert shm.read("f", {"shared_memory_region": "r", "shared_memory_byte_size": 4,
                          "shared_memory_offset": 8}, 4) == b"\x01\x02\x03\x04"
    with pytest.raises(ShmError, match="need 8"):
        shm.read("inputs[0]", {"shared_memory_region": "r", "shared_memory_byte_size": 4}, 8)
    with pytest.raises(ShmError, match="not within region 'r'"):
        shm.target("outputs[0]", {"shared_memory_region": "r", "shared_memory_byte_size": 128,
                                  "shared_memory_offset": 1})
    with pytest.raises(ShmError, match="do not fit"):
        shm.write("r", 0, 4, b"12345")
    with pytest.raises(ShmError) as exc:
        shm.status("nope")
    assert exc.value.not_found
    shm.close()
    assert shm.status() == []
    path.chmod(0o640)
    with pytest.raises(ShmError, match="accessible to no one else"):
        shm.register("r", key, 0, 16)


def _request(raw: list[bytes] | None = None) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="a", id="x")
    req.inputs.add(name="image", datatype="UINT8", shape=[3])
    req.inputs.add(name="text", datatype="BYTES", shape=[2])
    if raw is not None:
        req.raw_input_contents.extend(raw)
    return req


def test_grpc_codec_reads_raw_and_typed_contents() -> None:
    words = b"".join(struct.pack("<I", len(w)) + w for w in (b"hi", b"there"))
    got = parse_grpc_request(_request([b"\x01\x02\x03", words]), APP, None, time_remaining_s=0.5)
    assert got.id == "x" and got.timeout_us == 500_000
    assert got.inputs[0][3].tolist() == [1, 2, 3] and got.inputs[1][3] == ["hi", "there"]
    typed = _request()
    typed.inputs[0].contents.uint_contents.extend([1, 2, 3])
    typed.inputs[1].contents.bytes_contents.extend([b"a", b"b"])
    typed.parameters["timeout"].int64_param = 100
    got = parse_grpc_request(typed, APP, None, time_remaining_s=5.0)
    assert got.inputs[0][3].tolist() == [1, 2, 3] and got.timeout_us == 100  # the sooner one
    cases = [(_request([b"\x01\x02\x03"]), "raw_input_contents: 1 entries for 2 inputs"),
             (_request([b"\x01\x02", words]), "raw_input_contents[0]: 2 bytes for UINT8 shape [3]"),
             (_request([b"\x01\x02\x03", words + b"!"]), "inputs[1]: 1 raw bytes past its 2 BYTES"),
             (_request([b"\x01\x02\x03", b"\x09\x00\x00\x00ab"]), "inputs[1]: BYTES element runs past")]
    for req, message in cases:
        with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_grpc_request(req, APP, None)
    bad = _request([b"\x01\x02\x03", words])
    bad.parameters["priority"].int64_param = 2
    with pytest.raises(BadRequest, match=r"parameters\.priority"):
        parse_grpc_request(bad, APP, None)


def test_grpc_answer_and_error_codes() -> None:
    doc = {"model_name": "a", "model_version": "1", "id": "x",
           "outputs": [{"name": "t.out", "datatype": "FP32", "shape": [2], "data": np.array([1.5, 2.0]),
                        "parameters": {"emulated": True}},
                       {"name": "t.text", "datatype": "BYTES", "shape": [1], "data": np.array(["ok"])}],
           "parameters": {"lane.t": "v", "queue_us.t": 1.5, "items.t": 1, "emulated": True}}
    r = encode_grpc_response(doc)
    assert np.frombuffer(r.raw_output_contents[0], np.float32).tolist() == [1.5, 2.0]
    assert r.raw_output_contents[1] == b"\x02\x00\x00\x00ok"
    assert r.parameters["items.t"].int64_param == 1 and r.parameters["queue_us.t"].double_param == 1.5
    assert code_of(503, {}, "shed") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert code_of(503, {"reason": "worker_failed"}) == grpc.StatusCode.UNAVAILABLE
    assert code_of(504, {}) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert code_of(400, {}) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(404, {}) == grpc.StatusCode.NOT_FOUND


def test_statistics_sum_the_tasks_into_the_app() -> None:
    stats = ms.ModelStats()
    t, batches = stats.task_series("a", "t")
    ms.count_item(t, batches, 10.0, 2.0, 30.0, 4.0, 2)  # the two items of one batch of 2
    ms.count_item(t, batches, 20.0, 3.0, 30.0, -1.0, 2)
    stats.request_done("a", True, 50_000)
    stats.request_done("a", False, 7_000)
    head, task = ms.app_entries(stats, "a", ("t",), {"t": 1.0})
    assert task["name"] == "a.t" and task["inference_count"] == 2 and task["execution_count"] == 1
    s = task["inference_stats"]
    assert s["queue"] == {"count": 2, "ns": 30_000} and s["compute_input"]["ns"] == 5_000
    assert s["compute_infer"] == {"count": 2, "ns": 60_000}
    assert s["compute_output"] == {"count": 1, "ns": 4_000} and s["fail"]["count"] == 1
    assert task["batch_stats"] == [{"batch_size": 2, "compute_input": {"count": 0, "ns": 0},
                                    "compute_infer": {"count": 1, "ns": 30_000},
                                    "compute_output": {"count": 0, "ns": 0}}]
    assert head["inference_stats"]["success"] == {"count": 1, "ns": 50_000}
    assert head["inference_stats"]["fail"] == {"count": 1, "ns": 7_000}
    assert head["inference_stats"]["queue"]["ns"] == 30_000 and head["inference_count"] == 2


def test_grpc_port_in_use_stops_the_daemon_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "jigsaw.daemon", "--node-config", str(ROOT / "examples" / "h100x4.toml"),
               "--emulate", "--apps", "traffic_analysis", "--demand", "5", "--no-controller",
               "--port", str(free_port()), "--grpc-port", str(port)]
        env = dict(os.environ, PYTHONPATH=str(SRC))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 1
    assert f"gRPC: cannot bind 127.0.0.1:{port}" in done.stderr



def test_shed_is_resource_exhausted(tmp_path: Path) -> None:
    """A request shed at the door (max_queue 1, a 300 ms task) is RESOURCE_EXHAUSTED, HTTP's words."""
    import asyncio

    sys.path.insert(0, str(ROOT / "tests" / "dataplane"))
    import tritonclient.grpc.aio as agrpc
    from dpserver import write_tiny

    from jigsaw.testing import jigsawd, shm_entries

    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 300.0}, 1)], latency_slo_ms=20000.0,
                      max_queue=1)
    port = free_port()
    server = jigsawd(args, tmp_path / "jigsawd.log", cwd=ROOT, grpc_port=port)

    async def burst() -> list[str]:
        c = agrpc.InferenceServerClient(f"127.0.0.1:{port}")
        x = agrpc.InferInput("image", [4], "UINT8")
        x.set_data_from_numpy(np.arange(4, dtype=np.uint8))
        try:
            got = await asyncio.gather(*(c.infer("tiny", [x]) for _ in range(4)), return_exceptions=True)
        finally:
            await c.close()
        return ["OK" if not isinstance(r, Exception) else f"{r.status()}: {r.message()}" for r in got]

    with server:
        answers = asyncio.run(burst())
    assert answers.count("OK") >= 1, answers
    shed = [a for a in answers if a != "OK"]
    assert shed and all(a.startswith("StatusCode.RESOURCE_EXHAUSTED: model 'tiny' has 1 requests in flight")
                        for a in shed), answers
    assert shm_entries(server.proc.pid) == []
