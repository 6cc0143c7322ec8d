"""MIG through NVML, against the emulated NVML (pynvml's names, types and codes; the placement
rules of the A100/H100 tables; IN_USE for what a process holds): exact call sequences, and every
step of a create or destroy failing with nothing left half-made."""

from __future__ import annotations

import ctypes

import pytest

from jigsaw.gpu import emulated_nvml as fake
from jigsaw.gpu.emulated_nvml import EmulatedNvml, NVMLError, gi_profile_id
from jigsaw.gpu.layout import NodeInstance
from jigsaw.gpu.nvml import MigApplier, MigError
from jigsaw.mig import GPU_MODELS

H100 = GPU_MODELS["H100-80GB"]
A100 = GPU_MODELS["A100-40GB"]


def inst(gpu, profile, start, **kw) -> NodeInstance:
    return NodeInstance(gpu, profile, start, "app", "t", "v", **kw)


@pytest.fixture
def nvml() -> EmulatedNvml:
    return EmulatedNvml(H100, 2)


@pytest.fixture
def mig(nvml) -> MigApplier:
    m = MigApplier(H100, nvml)
    m.open()
    yield m
    m.close()


def test_same_names_codes_and_fields_as_pynvml():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    for name in dir(fake):
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(fake, name), name
    for struct in ("c_nvmlGpuInstancePlacement_t", "c_nvmlGpuInstanceInfo_t", "c_nvmlComputeInstanceInfo_t",
                   "c_nvmlGpuInstanceProfileInfo_v2_t", "c_nvmlComputeInstanceProfileInfo_v2_t"):
        ours = [f[0] for f in getattr(fake, struct)._fields_]
        theirs = [f[0] for f in getattr(pynvml, struct)._fields_]
        assert ours == theirs, struct
    used = [n for n in dir(EmulatedNvml) if n.startswith("nvml")]
    assert used and all(callable(getattr(pynvml, n)) for n in used)
    assert issubclass(pynvml.NVMLError, Exception) and NVMLError(23).value == 23


def test_profile_ids_match_the_tables():
    assert {p.name: gi_profile_id(p) for p in H100.profiles} == {
        "1g.10gb": 0, "1g.10gb+me": 7, "1g.20gb": 9, "2g.20gb": 1, "3g.40gb": 2, "4g.40gb": 3, "7g.80gb": 4}


def test_create_is_the_documented_sequence_and_returns_the_uuid(mig, nvml):
    nvml.calls.clear()
    made = mig.create(inst(1, "3g.40gb", 4))
    assert made.uuid.startswith("MIG-")
    calls = [c[0] for c in nvml.calls]
    assert calls[:5] == ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetGpuInstanceProfileInfo",
                         "nvmlDeviceCreateGpuInstanceWithPlacement",
                         "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                         "nvmlGpuInstanceCreateComputeInstance"]
    assert nvml.mutations() == [("nvmlDeviceCreateGpuInstanceWithPlacement", 1, "profile=2 start=4"),
                                ("nvmlGpuInstanceCreateComputeInstance", 1, "gi=1 profile=2")]
    assert {c[1] for c in nvml.calls} == {1}  # GPU 0 is never asked
    assert nvml.instances(1) == [("3g.40gb", 4, 1)]
    assert mig.uuid_of(made) == made.uuid
    assert mig.existing(1)[0].uuid == made.uuid


@pytest.mark.parametrize("model, bad", [
    (H100, [("4g.40gb", 0), ("3g.40gb", 0)]),  # overlap
    (H100, [("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 0)]),  # full
    (A100, [("7g.40gb", 0), ("1g.5gb", 6)]),
    (H100, [("1g.10gb+me", 0), ("1g.10gb+me", 1)]),  # one +me per GPU
])
def test_placement_rules_are_enforced_and_nothing_is_left(model, bad):
    nvml = EmulatedNvml(model, 1)
    mig = MigApplier(model, nvml)
    *ok, last = bad
    for profile, start in ok:
        mig.create(inst(0, profile, start))
    before = nvml.instances(0)
    with pytest.raises(MigError) as err:
        mig.create(inst(0, *last))
    assert err.value.code == fake.NVML_ERROR_INSUFFICIENT_RESOURCES
    assert "the slots are taken" in str(err.value)
    assert nvml.instances(0) == before


def test_a_start_the_profile_does_not_allow_is_invalid(mig, nvml):
    with pytest.raises(MigError) as err:
        mig.create(inst(0, "3g.40gb", 2))
    assert err.value.code == fake.NVML_ERROR_INVALID_ARGUMENT
    assert nvml.instances(0) == []


CREATE_STEPS = ["nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceCreateGpuInstanceWithPlacement",
                "nvmlGpuInstanceGetComputeInstanceProfileInfo", "nvmlGpuInstanceCreateComputeInstance",
                "nvmlGpuInstanceGetInfo", "nvmlComputeInstanceGetInfo", "nvmlDeviceGetMigDeviceHandleByIndex",
                "nvmlDeviceGetUUID"]


@pytest.mark.parametrize("function", CREATE_STEPS)
@pytest.mark.parametrize("code", [fake.NVML_ERROR_INSUFFICIENT_RESOURCES, fake.NVML_ERROR_NO_PERMISSION,
                                  fake.NVML_ERROR_UNKNOWN])
def test_every_step_of_a_create_failing_leaves_nothing(mig, nvml, function, code):
    mig.create(inst(0, "4g.40gb", 0))
    nvml.inject(function, code)
    with pytest.raises(MigError) as err:
        mig.create(inst(0, "3g.40gb", 4))
    assert err.value.code == code
    assert nvml.instances(0) == [("4g.40gb", 0, 1)]
    if code == fake.NVML_ERROR_NO_PERMISSION:
        assert "needs root" in str(err.value)
    # and the slots are usable again
    assert mig.create(inst(0, "3g.40gb", 4)).uuid


def test_destroy_removes_compute_then_gpu_instance(mig, nvml):
    a = mig.create(inst(0, "2g.20gb", 2))
    nvml.calls.clear()
    mig.destroy(a)
    assert [c[0] for c in nvml.mutations()] == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    assert nvml.instances(0) == []


def test_an_instance_in_use_is_not_destroyed(mig, nvml):
    a = mig.create(inst(0, "2g.20gb", 2))
    nvml.attach(a.uuid)
    with pytest.raises(MigError) as err:
        mig.destroy(a)
    assert err.value.code == fake.NVML_ERROR_IN_USE and "still uses it" in str(err.value)
    assert nvml.instances(0) == [("2g.20gb", 2, 1)]
    assert mig.uuid_of(a) == a.uuid  # untouched: the process keeps its device
    nvml.detach(a.uuid)
    mig.destroy(a)
    assert nvml.instances(0) == []


def test_a_gpu_instance_destroy_failing_restores_its_compute_instance(mig, nvml):
    a = mig.create(inst(0, "2g.20gb", 2))
    nvml.inject("nvmlGpuInstanceDestroy", fake.NVML_ERROR_UNKNOWN)
    with pytest.raises(MigError):
        mig.destroy(a)
    assert nvml.instances(0) == [("2g.20gb", 2, 1)]  # whole again, usable
    assert mig.uuid_of(a).startswith("MIG-")


def test_destroying_what_is_not_there_is_a_clear_error(mig):
    with pytest.raises(MigError, match="no such MIG instance"):
        mig.destroy(inst(0, "1g.10gb", 3))


def test_mig_mode_off_says_how_to_turn_it_on():
    nvml = EmulatedNvml(H100, 3, mig_enabled=[True, False, False])
    nvml._gpus[2].pending_mode = 1
    mig = MigApplier(H100, nvml)
    with pytest.raises(MigError) as err:
        mig.check_mig_mode(range(3))
    msg = str(err.value)
    assert "GPU 1 (off)" in msg and "GPU 2 (enabled, pending a GPU reset)" in msg
    assert "sudo nvidia-smi -i 1,2 -mig 1" in msg and "GPU 0" not in msg


def test_adopt_reads_what_exists_and_completes_leftovers(nvml):
    mig = MigApplier(H100, nvml)
    a = mig.create(inst(0, "3g.40gb", 0))
    # a leftover GPU instance without compute instance (a crash between the two creates)
    dev = nvml.nvmlDeviceGetHandleByIndex(1)
    pl = fake.c_nvmlGpuInstancePlacement_t(6, 2)
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(dev, fake.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
                                                  ctypes.byref(pl))
    assert nvml.instances(1) == [("1g.20gb", 6, 0)]
    adopted = mig.adopt(2)
    assert [(i.gpu, i.profile, i.start, i.is_idle) for i in adopted.instances] == [
        (0, "3g.40gb", 0, True), (1, "1g.20gb", 6, True)]
    assert adopted.instances[0].uuid == a.uuid and adopted.instances[1].uuid.startswith("MIG-")
    assert nvml.instances(1) == [("1g.20gb", 6, 1)]


def test_uninitialized_nvml_is_refused():
    nvml = EmulatedNvml(H100, 1)
    with pytest.raises(NVMLError) as err:
        nvml.nvmlDeviceGetCount()
    assert err.value.value == fake.NVML_ERROR_UNINITIALIZED


def test_without_pynvml_the_error_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *a, **kw):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(MigError, match=r"pip install 'jigsaw\[gpu\]'"):
        MigApplier(H100).open()


def test_a_gpu_with_mig_instance_shares_finds_and_destroys_its_instances():
    """A MIG share (``1g.10gb-1of2``) has its host's NVML profile id but is no NVML profile: the
    instances found are the host's (they were read as the share's, and no destroy found its
    instance: every re-plan of a node with the default shares failed after its drain)."""
    from jigsaw.mig import with_mig_shares

    shared = with_mig_shares(H100, [2, 4], ["1g.10gb"])
    nvml = EmulatedNvml(shared, 1)
    mig = MigApplier(shared, nvml)
    mig.open()
    try:
        a = mig.create(inst(0, "1g.10gb", 2))
        assert [(i.profile, i.start) for i in mig.existing(0)] == [("1g.10gb", 2)]
        mig.destroy(a)
        assert nvml.instances(0) == []
    finally:
        mig.close()
