"""The reconfiguration executor on the emulated NVML with real worker processes: the exact
sequence of each reconfiguration, no NVML call on unchanged GPUs, the same pids for unchanged
instances, and every step of a mixed reconfiguration failing, each rolled back to the running
layout with nothing half-created."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from gpu_workers import ProcessWorkers

from jigsaw.gpu.diff import Action, diff
from jigsaw.gpu.emulated_nvml import NVML_ERROR_INSUFFICIENT_RESOURCES, EmulatedNvml
from jigsaw.gpu.executor import Reconfigurer, make_reconfigurer
from jigsaw.gpu.layout import NodeInstance, NodeLayout
from jigsaw.gpu.mps import EmulatedMps, MpsError
from jigsaw.gpu.nvml import MigApplier
from jigsaw.mig import GPU_MODELS

H100 = GPU_MODELS["H100-80GB"]


def inst(gpu, profile, start, variant, mps=1) -> NodeInstance:
    return NodeInstance(gpu, profile, start, "a", "t", variant, mps)


def layout(*instances) -> NodeLayout:
    return NodeLayout(H100.name, 2, tuple(instances))


D1 = layout(inst(0, "4g.40gb", 0, "big", 2), inst(0, "3g.40gb", 4, "keep"),
            inst(1, "3g.40gb", 0, "x"), inst(1, "1g.10gb", 6, "y", 2))
# every kind at once: an early create (GPU 1), a swap (GPU 0 @4), a blocked create (the 4g
# becomes two 2g), a plain remove (GPU 1 @0), and kept instances
D4 = layout(inst(0, "2g.20gb", 0, "p", 2), inst(0, "2g.20gb", 2, "q"), inst(0, "3g.40gb", 4, "z", 2),
            inst(1, "2g.20gb", 4, "n"), inst(1, "1g.10gb", 6, "y", 2))


class FailingMps(EmulatedMps):
    """Emulated MPS whose n-th start or stop (0-based, per kind) fails."""

    def __init__(self, run_dir, log: list) -> None:
        super().__init__(run_dir)
        self.fail_on: set[tuple[str, int]] = set()
        self.counts = {"start": 0, "stop": 0}
        self.log = log

    def _count(self, kind: str, i: NodeInstance) -> None:
        n = self.counts[kind]
        self.counts[kind] += 1
        self.log.append((f"mps_{kind}", i.name))
        if (kind, n) in self.fail_on:
            raise MpsError(f"MPS {kind} #{n} failed (injected)", step=f"{kind}_mps")

    def start(self, inst):
        self._count("start", inst)
        return super().start(inst)

    def stop(self, inst):
        if inst.slot in self.daemons:
            self._count("stop", inst)
        return super().stop(inst)


@pytest.fixture
def node(tmp_path, workers: ProcessWorkers):
    nvml = EmulatedNvml(H100, 2)
    history: list[dict] = []
    mps = FailingMps(tmp_path / "mps", workers.calls)
    rec = Reconfigurer(H100, MigApplier(H100, nvml), mps, workers, record=history.append)
    return rec, nvml, mps, history


def apply(rec: Reconfigurer, running: NodeLayout, desired: NodeLayout):
    return asyncio.run(rec.apply(running, desired))


def check_consistent(result, nvml: EmulatedNvml, workers: ProcessWorkers, mps: EmulatedMps) -> None:
    """The result's running layout is what really exists: MIG instances, processes, MPS daemons."""
    running = result.running
    for g in range(running.num_gpus):
        assert nvml.instances(g) == sorted((i.profile, i.start, 1) for i in running.on_gpu(g)), g
    alive = workers.alive()
    assert set(alive) == {(i.slot, i.workload) for i in running.instances}
    for i in running.instances:
        assert alive[(i.slot, i.workload)] == i.pids and len(i.pids) == i.mps
        assert i.uuid and workers.envs[i.name]["CUDA_VISIBLE_DEVICES"] == i.uuid
        assert i.uuid in {u for g in range(2) for u in _uuids(nvml, g)}
    assert set(mps.daemons) == {i.slot for i in running.instances if i.mps > 1}
    assert {i.slot for i in workers.routes[-1].instances} == {i.slot for i in running.instances}


def _uuids(nvml: EmulatedNvml, g: int) -> list[str]:
    return [i.uuid for i in MigApplier(H100, nvml).existing(g)]


def test_deploy_keep_and_change_one_gpu(node, workers):
    rec, nvml, mps, history = node
    empty = asyncio.run(asyncio.to_thread(rec.mig.adopt, 2))
    assert empty.instances == ()
    r1 = apply(rec, empty, D1)
    assert r1.ok, r1.error
    check_consistent(r1, nvml, workers, mps)
    assert r1.plan.summary()["started"] == 4
    # MPS before processes, in each instance
    names = [c for c in workers.calls if c[0] in ("mps_start", "start")]
    big = "gpu0/4g.40gb@0:a/t/bigx2"
    assert names.index(("mps_start", big)) < names.index(("start", big))
    assert workers.envs["gpu0/4g.40gb@0:a/t/bigx2"]["CUDA_MPS_PIPE_DIRECTORY"].endswith("pipe")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in workers.envs["gpu0/3g.40gb@4:a/t/keepx1"]

    # the same layout again (a re-weight): no NVML call at all, the same processes
    nvml.calls.clear()
    workers.calls.clear()
    pids = workers.alive()
    r2 = apply(rec, r1.running, D1)
    assert r2.ok and nvml.calls == [] and workers.alive() == pids
    assert [c[0] for c in workers.calls] == ["route"]
    assert r2.running == r1.running

    # GPU 0 repartitioned: GPU 1 gets no NVML call, every kept instance keeps its pids
    d3 = layout(inst(0, "2g.20gb", 0, "p", 2), inst(0, "2g.20gb", 2, "q"), inst(0, "3g.40gb", 4, "keep"),
                inst(1, "3g.40gb", 0, "x"), inst(1, "1g.10gb", 6, "y", 2))
    nvml.calls.clear()
    workers.calls.clear()
    r3 = apply(rec, r2.running, d3)
    assert r3.ok, r3.error
    assert {c[1] for c in nvml.calls} == {0}, nvml.calls  # GPU 1: not one call, not even a read
    assert [c[0] for c in nvml.mutations()] == [
        "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy",  # the 4g, drained first
        "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance"]
    check_consistent(r3, nvml, workers, mps)
    for k in r3.plan.keep:
        assert workers.alive()[(k.slot, k.workload)] == pids[(k.slot, k.workload)]
    assert [c for c in workers.calls if c[0] == "start"] == [("start", "gpu0/2g.20gb@0:a/t/px2"),
                                                             ("start", "gpu0/2g.20gb@2:a/t/qx1")]
    # MPS of the removed 4g stopped after its processes
    order = [c for c in workers.calls if c[1] == "gpu0/4g.40gb@0:a/t/bigx2"]
    assert order == [("drain", order[0][1]), ("stop", order[0][1]), ("mps_stop", order[0][1])]
    assert [h["ok"] for h in history] == [True, True, True]
    assert history[2]["nvml_gpus"] == [0] and history[2]["kept"] == 3 and history[2]["started"] == 2
    assert rec.stats.instances_started_total == 6 and rec.stats.reconfigs_total == 3
    assert 'jigsaw_reconfiguration_instances_total{what="kept"} 7' in rec.stats.prometheus()


STEPS = diff(replace(D1, instances=tuple(replace(i, uuid="u", pids=(1,) * i.mps) for i in D1.instances)),
             D4, H100).steps


def test_the_mixed_reconfiguration_has_every_kind_of_step():
    kinds = [s.action for s in STEPS]
    assert set(kinds) == set(Action)
    assert kinds.count(Action.ROUTE) == 2  # interim (instances in the way drained) and final


@pytest.mark.parametrize("k", range(len(STEPS)), ids=[f"{k}-{s.describe()}" for k, s in enumerate(STEPS)])
def test_every_step_failing_rolls_back_to_the_running_layout(node, workers, k):
    rec, nvml, mps, history = node
    r1 = apply(rec, NodeLayout(H100.name, 2), D1)
    assert r1.ok
    before_pids = workers.alive()
    before_mig = [nvml.instances(g) for g in range(2)]
    step = STEPS[k]
    nth = sum(1 for s in STEPS[:k] if s.action is step.action)
    workers._counts.clear()
    mps.counts = {"start": 0, "stop": 0}
    a = step.action
    if a is Action.CREATE_MIG:
        nvml.inject("nvmlGpuInstanceCreateComputeInstance", NVML_ERROR_INSUFFICIENT_RESOURCES, skip=nth)
    elif a is Action.DESTROY_MIG:
        victim = next(i for i in r1.running.instances if i.slot == step.instance.slot)
        nvml.attach(victim.uuid)  # a process still holds it: NVML refuses (IN_USE)
    elif a in (Action.START_MPS, Action.STOP_MPS):
        mps.fail_on = {("start" if a is Action.START_MPS else "stop", nth)}
    else:
        method = {Action.START_PROCESSES: "start", Action.WAIT_WARM: "wait_warm", Action.ROUTE: "route",
                  Action.DRAIN: "drain", Action.STOP_PROCESSES: "stop"}[a]
        nth = sum(1 for s in STEPS[:k] if s.action is a)
        workers.fail_on = {(method, nth)}
    result = apply(rec, r1.running, D4)
    assert not result.ok
    assert result.failed_step == a.value, result.error
    assert result.rollback_errors == ()
    nvml.detach(getattr(step.instance, "uuid", "") or "")
    for i in r1.running.instances:
        nvml.detach(i.uuid)
    # back on the running layout: same MIG partition, same workloads, everything alive and routed
    assert [nvml.instances(g) for g in range(2)] == before_mig
    assert {(i.slot, i.workload) for i in result.running.instances} == {(i.slot, i.workload)
                                                                        for i in r1.running.instances}
    check_consistent(result, nvml, workers, mps)
    untouched = [i for i in r1.running.instances if i.slot in {x.slot for x in result.plan.keep}]
    for i in untouched:  # instances the reconfiguration keeps were never restarted
        assert workers.alive()[(i.slot, i.workload)] == before_pids[(i.slot, i.workload)]
    event = history[-1]
    assert event["ok"] is False and event["rolled_back"] is True and event["failed_step"] == a.value
    assert rec.stats.failures_total[a.value] == 1 and rec.stats.rollbacks_total == 1
    assert f'jigsaw_reconfiguration_failures_total{{step="{a.value}"}} 1' in rec.stats.prometheus()
    # and the node still reconfigures once the cause is gone
    workers.fail_on = set()
    mps.fail_on = set()
    again = apply(rec, result.running, D4)
    assert again.ok, again.error
    check_consistent(again, nvml, workers, mps)


def test_emulated_node_factory_runs_the_same_sequence(tmp_path, workers):
    from pathlib import Path

    from jigsaw.node import load_node

    node = load_node(Path(__file__).resolve().parents[2] / "examples" / "h100x4.toml", load_apps=False)
    rec = make_reconfigurer(node, workers, emulate=True, run_dir=tmp_path / "mps")
    assert isinstance(rec.mig.nvml, EmulatedNvml)
    running = NodeLayout(node.gpu.name, node.num_gpus)
    desired = NodeLayout(node.gpu.name, node.num_gpus, (inst(3, "7g.80gb", 0, "w", 4),))
    result = asyncio.run(rec.apply(running, desired))
    assert result.ok and result.running.instances[0].uuid.startswith("MIG-")
    assert {c[1] for c in rec.mig.nvml.mutations()} == {3}


def test_start_up_adopts_matching_instances_instead_of_recreating_them(node, workers):
    from jigsaw.gpu.layout import place_app
    from jigsaw.planner.packer import InstanceRequest

    rec, nvml, mps, _ = node
    # what an earlier run of the node left: a 3g at 4 and a 7g on GPU 1
    left = [rec.mig.create(NodeInstance(0, "3g.40gb", 4)), rec.mig.create(NodeInstance(1, "7g.80gb", 0))]
    nvml.calls.clear()
    adopted = rec.mig.adopt(2)
    assert {(i.slot, i.uuid) for i in adopted.instances} == {(i.slot, i.uuid) for i in left}
    wanted = [InstanceRequest("3g.40gb", "t", "v", 2), InstanceRequest("4g.40gb", "t", "w")]
    placed = place_app(adopted, "a", wanted, H100)
    assert any(i.is_idle for i in placed.instances)  # another app could still take the 7g
    desired = placed.without_idle()  # every app placed: the rest goes
    nvml.calls.clear()
    result = apply(rec, adopted, desired)
    assert result.ok, result.error
    check_consistent(result, nvml, workers, mps)
    three = next(i for i in result.running.instances if i.profile == "3g.40gb")
    assert three.slot == (0, 4, "3g.40gb") and three.uuid == left[0].uuid  # the same MIG instance
    assert [(c[0], c[1]) for c in nvml.mutations()] == [
        ("nvmlDeviceCreateGpuInstanceWithPlacement", 0),  # the 4g
        ("nvmlGpuInstanceCreateComputeInstance", 0),
        ("nvmlComputeInstanceDestroy", 1), ("nvmlGpuInstanceDestroy", 1)]  # the unused 7g


def test_a_callback_that_hangs_times_out_and_rolls_back(node, workers):
    rec, nvml, mps, history = node
    r1 = apply(rec, NodeLayout(H100.name, 2), D1)
    rec.step_timeout_s = 0.2

    async def hang(inst):
        await asyncio.sleep(30)

    workers.wait_warm = hang
    result = apply(rec, r1.running, D4)
    assert not result.ok and result.failed_step == "wait_warm"
    assert "did not finish within 0.2 s" in result.error
    check_consistent(result, nvml, workers, mps)
    assert history[-1]["rolled_back"] is True


def test_an_invalid_desired_layout_is_refused_before_any_step(node, workers):
    from jigsaw.gpu.executor import ReconfigError

    rec, nvml, _, _ = node
    bad = layout(inst(0, "4g.40gb", 0, "a"), inst(0, "3g.40gb", 0, "b"))
    nvml.calls.clear()
    with pytest.raises(ReconfigError, match="overlaps"):
        apply(rec, NodeLayout(H100.name, 2), bad)
    assert nvml.calls == [] and workers.calls == []
