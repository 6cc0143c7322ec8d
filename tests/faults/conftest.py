"""The fault tests run against both HTTP front ends, as the data-plane tests do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
import dpserver


@pytest.fixture(scope="module", params=dpserver.HTTP_FRONTS, autouse=True)
def http_front(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this directory runs against both HTTP front ends (``[server] http``)."""
    dpserver.http_front = request.param
    yield request.param
    dpserver.http_front = None
