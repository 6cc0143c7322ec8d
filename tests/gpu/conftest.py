"""The gpu tests' fixtures: stand-in workers with real processes (``gpu_workers``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_workers import ProcessWorkers


@pytest.fixture
def workers() -> Iterator[ProcessWorkers]:
    w = ProcessWorkers()
    try:
        yield w
    finally:
        w.cleanup()
