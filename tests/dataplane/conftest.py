"""Fixtures of the data-plane tests (helpers live in ``dpserver``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dpserver
import pytest
from dpserver import Server


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(args) -> Server`` (entered); every server is stopped and checked at teardown."""
    stack = contextlib.ExitStack()

    def start(args: list[str], name: str = "jigsawd") -> Server:
        return stack.enter_context(Server(args, tmp_path / f"{name}.log"))

    with stack:
        yield start


@pytest.fixture(scope="module", params=dpserver.HTTP_FRONTS, autouse=True)
def http_front(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this directory runs against both HTTP front ends (``[server] http``)."""
    dpserver.http_front = request.param
    yield request.param
    dpserver.http_front = None
