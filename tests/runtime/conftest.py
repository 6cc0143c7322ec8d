"""Fixtures for the data-plane core: every test runs against the compiled and the pure implementation."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from jigsaw.runtime import _pybatching, _pyring
from jigsaw.runtime.rings import SHM_DIR, SegmentRegistry, load_core

_core = load_core()


def _namespace(name: str) -> SimpleNamespace:
    if name == "compiled":
        assert _core is not None
        return SimpleNamespace(name=name, ShmRing=_core.ShmRing, RecordHeader=_core.RecordHeader,
                               BatchQueue=_core.BatchQueue)
    return SimpleNamespace(name=name, ShmRing=_pyring.ShmRing, RecordHeader=_pyring.RecordHeader,
                           BatchQueue=_pybatching.BatchQueue)


_NO_EXT = pytest.mark.skipif(
    _core is None,
    reason="jigsaw._core is not built (run `python setup.py build_ext --inplace --build-lib src`) "
           "or JIGSAW_NO_EXTENSIONS=1",
)
IMPLS = [pytest.param("compiled", marks=_NO_EXT), "pure"]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> SimpleNamespace:
    """The implementation under test: ``.ShmRing``, ``.RecordHeader``, ``.BatchQueue``, ``.name``."""
    return _namespace(request.param)


@pytest.fixture
def pure_impl() -> SimpleNamespace:
    return _namespace("pure")


@pytest.fixture
def compiled_impl() -> SimpleNamespace:
    if _core is None:
        pytest.skip("jigsaw._core is not built or JIGSAW_NO_EXTENSIONS=1")
    return _namespace("compiled")


def own_shm_entries() -> set[str]:
    """Entries in /dev/shm named for this test process (rings and ``sem.`` doorbells)."""
    tag = f"jigsaw-{os.getpid()}-"
    return {e for e in os.listdir(SHM_DIR) if e.startswith(tag) or e.startswith("sem." + tag)}


@pytest.fixture
def registry(tmp_path: Path) -> SegmentRegistry:
    """A registry whose segments are unlinked after the test, pass or fail."""
    reg = SegmentRegistry(tmp_path / "manifest")
    yield reg
    reg.cleanup()


@pytest.fixture(autouse=True)
def no_leaked_segments() -> None:
    """Fail a test that leaves any of this process's segments or semaphores behind."""
    before = own_shm_entries()
    yield
    leaked = own_shm_entries() - before
    if leaked:
        for entry in leaked:
            path = SHM_DIR / entry
            path.unlink(missing_ok=True)
        pytest.fail(f"test leaked shared-memory objects: {sorted(leaked)}")


@pytest.fixture
def new_ring(impl: SimpleNamespace, registry: SegmentRegistry):
    """``new_ring(purpose, capacity_bytes, **kw)``: a ring of the implementation under test, tracked by
    the registry and unmapped after the test."""
    made = []

    def make(purpose: str, capacity_bytes: int, **kw):
        name = registry.name(purpose)
        registry.add_shm(name)
        ring = impl.ShmRing.create(name, capacity_bytes, **kw)
        made.append(ring)
        return ring

    yield make
    for ring in made:
        ring.close()
