"""Triton's model repository extension over the node's apps: index, load, unload.

The repository is the node file's apps. ``index`` lists each with Triton's state (``READY``:
served; ``UNAVAILABLE``: known but not served, with the reason). ``load`` / ``unload`` change
what the node serves, which only the node's controller may do (a node re-plan), so the daemon
hands the front ends a ``Repository``: the controller's (``control/repository.py``) where one
runs, else ``StaticRepository`` (static plans: the served apps, nothing to load or unload).
Both calls answer once the node serves the new state; a refusal raises ``RepositoryError``
with its reason (HTTP 400 / 404, gRPC INVALID_ARGUMENT / NOT_FOUND / UNAVAILABLE).
"""

from __future__ import annotations

from typing import Any, Protocol

READY, UNAVAILABLE = "READY", "UNAVAILABLE"


class RepositoryError(Exception):
    """A refused load or unload; ``kind``: "not_found" (no such app), "unavailable" (cannot now),
    "invalid" (cannot at all)."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


class Repository(Protocol):
    def index(self) -> list[dict[str, Any]]: ...  # name, version, state, reason
    async def load(self, app: str) -> None: ...
    async def unload(self, app: str) -> None: ...


def entry(name: str, served: bool, reason: str = "") -> dict[str, Any]:
    """One index entry in Triton's schema."""
    doc: dict[str, Any] = {"name": name, "version": "1", "state": READY if served else UNAVAILABLE}
    if reason or not served:
        doc["reason"] = reason or "unloaded"
    return doc


class StaticRepository:
    """The node's apps when no controller runs: the served ones ready, the others not loadable."""

    def __init__(self, node_apps: list[str], served: list[str]) -> None:
        self.node_apps = node_apps
        self.served = served

    def index(self) -> list[dict[str, Any]]:
        return [entry(a, a in self.served, "" if a in self.served else "not served by this daemon (--apps)")
                for a in self.node_apps]

    def _known(self, app: str) -> None:
        if app not in self.node_apps:
            raise RepositoryError(f"unknown model {app!r} (the node's apps: {', '.join(self.node_apps)})",
                                  "not_found")

    async def load(self, app: str) -> None:
        self._known(app)
        if app not in self.served:
            raise RepositoryError(f"model {app!r} cannot be loaded: this daemon serves static plans "
                                  "(--plan or --no-controller); no controller runs to plan it")

    async def unload(self, app: str) -> None:
        self._known(app)
        raise RepositoryError(f"model {app!r} cannot be unloaded: this daemon serves static plans "
                              "(--plan or --no-controller); no controller runs to re-plan the node")
