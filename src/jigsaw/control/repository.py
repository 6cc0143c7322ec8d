"""Triton's model repository over the node controller: unload and load re-plan the node.

``unload``: the app's door closes (its name answers 404), its generation drains (every request
answered) and retires, its MIG slots go back to the node, and the node is re-planned for the apps
it still serves (``NodeController.set_app_enabled``). ``load``: the app's last plan is placed
beside the others and started; once every process is ready it is routed, and the node is
re-planned with it. Both answer once the node serves the new state; a refusal says why.
An app of the node file that this daemon was not started with (``--apps``) is listed
``UNAVAILABLE`` and cannot be loaded without a restart (its profiles and models were not loaded).
"""

from __future__ import annotations

from typing import Any

from jigsaw.control.controller import NodeController
from jigsaw.errors import JigsawError
from jigsaw.runtime.repository import RepositoryError, entry


class ControllerRepository:
    """``runtime.repository.Repository`` for a node whose controller runs."""

    def __init__(self, ctl: NodeController, node_apps: list[str]) -> None:
        self.ctl = ctl
        self.node_apps = node_apps

    def index(self) -> list[dict[str, Any]]:
        out = []
        for name in self.node_apps:
            if name in self.ctl.apps:
                out.append(entry(name, True))
            elif name in self.ctl.unloaded:
                out.append(entry(name, False, "unloaded"))
            else:
                out.append(entry(name, False, "not served by this daemon (--apps): loading it needs a "
                                 "restart"))
        return out

    def _check(self, app: str) -> None:
        if app not in self.node_apps:
            raise RepositoryError(f"unknown model {app!r} (the node's apps: {', '.join(self.node_apps)})",
                                  "not_found")
        if app not in self.ctl.apps and app not in self.ctl.unloaded:
            raise RepositoryError(f"model {app!r} is not served by this daemon (--apps): loading it needs "
                                  "a restart")

    async def load(self, app: str) -> None:
        self._check(app)
        try:
            await self.ctl.set_app_enabled(app, True)
        except JigsawError as exc:
            raise RepositoryError(f"model {app!r} cannot be loaded: {exc}") from None

    async def unload(self, app: str) -> None:
        self._check(app)
        try:
            await self.ctl.set_app_enabled(app, False)
        except JigsawError as exc:
            raise RepositoryError(f"model {app!r} cannot be unloaded: {exc}") from None
