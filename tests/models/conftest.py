"""The model tests need the ``models`` extra; without torch they skip with that reason."""

from __future__ import annotations

import os

import pytest

try:
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    HAVE_MODELS = True
except ImportError:
    HAVE_MODELS = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAVE_MODELS:
        return
    skip = pytest.mark.skip(reason="torch/torchvision/onnxruntime not installed "
                                   "(pip install 'jigsaw[models]')")
    for item in items:
        if "tests/models" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _small_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Small inputs and a private ONNX cache keep the suite fast and the home directory clean.

    Under pytest-xdist the workers share one cache (in the run's common temporary directory): the
    exports are seeded, so every worker would write the same file, and each is written atomically
    (``graphs.export_graph``), so a worker exports a variant only when no other has yet.
    """
    os.environ["JIGSAW_DETECTOR_SIZE"] = "160"
    os.environ["JIGSAW_CLASSIFIER_SIZE"] = "64"
    base = tmp_path_factory.getbasetemp()
    cache = base.parent / "onnx-shared" if os.environ.get("PYTEST_XDIST_WORKER") else base / "onnx"
    cache.mkdir(exist_ok=True)
    os.environ.setdefault("JIGSAW_ONNX_CACHE", str(cache))
    os.environ["HF_HUB_OFFLINE"] = "1"
