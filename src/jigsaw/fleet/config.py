"""The fleet file: node groups (a node file and a count), apps with their demand, k8s settings.

    name = "h100-fleet"
    allocation = "balanced"           # or "fewest-slices"
    [[nodes]]
    name = "h100"                     # node names: h100-0, h100-1, ...
    node = "h100x4.toml"              # a node file (relative to this file)
    count = 30                        # gpus = 2: override the node file's GPU count
    [[apps]]
    name = "traffic_analysis"         # an app of every node file
    demand_rps = 40000
    [kubernetes]                      # all optional
    namespace = "jigsaw"

Nodes of one group are identical, which the planner exploits (it plans one node of a group,
not each). Relative paths are relative to the fleet file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from jigsaw.app import App
from jigsaw.fields import Fields, read_toml
from jigsaw.node import Node, load_node
from jigsaw.spaces import SPACES

ALLOCATIONS = ("balanced", "fewest-slices")
# Kubernetes object names (RFC 1123 labels): they become Deployment, Service and label values.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes described by one node file."""

    name: str
    node: Node
    count: int

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


@dataclass(frozen=True)
class FleetApp:
    app: App
    demand_rps: float

    @property
    def name(self) -> str:
        return self.app.name


@dataclass(frozen=True)
class KubeSettings:
    """What the rendered manifests need to know beyond the plan."""

    namespace: str = "jigsaw"
    image: str = "ghcr.io/jigsaw/jigsawd:latest"
    port: int = 8000
    gateway: str = "jigsaw-gateway"  # the Gateway (Gateway API) the HTTPRoutes attach to
    cpu: str = "8"  # the jigsawd pod's CPU and memory requests
    memory: str = "32Gi"


@dataclass(frozen=True)
class Fleet:
    name: str
    groups: tuple[NodeGroup, ...]
    apps: tuple[FleetApp, ...]
    allocation: str = "balanced"
    space: str | None = None  # None: each node file's planner.space
    time_limit_s: float | None = None  # per MILP solve; None: each node file's
    solver: str | None = None
    kube: KubeSettings = field(default_factory=KubeSettings)
    source: str = ""

    @property
    def num_nodes(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def num_gpus(self) -> int:
        return sum(g.count * g.node.num_gpus for g in self.groups)

    def group_of(self, node_name: str) -> NodeGroup:
        for g in self.groups:
            if node_name in g.node_names():
                return g
        raise KeyError(node_name)

    def with_demand(self, demand_rps: dict[str, float]) -> Fleet:
        """The same fleet with other demands (the per-bin re-plan of a replay)."""
        from dataclasses import replace
        apps = tuple(FleetApp(a.app, float(demand_rps.get(a.name, a.demand_rps))) for a in self.apps)
        return replace(self, apps=apps)


def load_fleet(path: str | Path) -> Fleet:
    """Reads and validates a fleet file and the node and app files it names."""
    path = Path(path)
    f = Fields(path, read_toml(path))
    f.reject_unknown({"name", "description", "allocation", "space", "time_limit_s", "solver",
                      "nodes", "apps", "kubernetes"})
    allocation = f.str("allocation", "balanced")
    if allocation not in ALLOCATIONS:
        raise f.error("allocation", f"expected one of {', '.join(ALLOCATIONS)}, got {allocation!r}")
    space = f.str("space", None)
    if space is not None and space not in SPACES:
        raise f.error("space", f"expected one of {', '.join(SPACES)}, got {space!r}")
    solver = f.str("solver", None)
    if solver is not None and solver not in ("cbc", "highs"):
        raise f.error("solver", f"expected 'cbc' or 'highs', got {solver!r}")
    time_limit = f.number("time_limit_s", None, low=0, low_open=True)

    groups: list[NodeGroup] = []
    for g in f.tables("nodes"):
        g.reject_unknown({"name", "node", "count", "gpus"})
        name = g.str("name")
        if not _DNS_LABEL.match(name):
            raise g.error("name", f"{name!r}: use lowercase letters, digits and '-' (a Kubernetes "
                                  "name), at most 42 characters")
        if any(x.name == name for x in groups):
            raise g.error("name", f"duplicate node group {name!r}")
        node = load_node(path.parent / g.str("node"))
        if g.has("gpus"):  # the node file's GPU count, overridden (smaller nodes of that kind)
            if node.is_mixed:
                raise g.error("gpus", f"{g.str('node')} has {len(node.groups)} GPU groups: its GPUs "
                                      "are each group's count in the node file")
            node = node.with_gpus(g.integer("gpus", low=1, high=1024))
        groups.append(NodeGroup(name, node, g.integer("count", 1, low=1, high=10_000)))
    if not groups:
        raise f.error("nodes", "expected at least one [[nodes]] group")

    apps: list[FleetApp] = []
    for a in f.tables("apps"):
        a.reject_unknown({"name", "demand_rps"})
        name = a.str("name")
        if any(x.name == name for x in apps):
            raise a.error("name", f"duplicate app {name!r}")
        found = [gr.node.app(name) for gr in groups if any(x.name == name for x in gr.node.apps)]
        if not found:
            raise a.error("name", f"no node group lists an app named {name!r}")
        apps.append(FleetApp(found[0], a.number("demand_rps", low=0)))
    if not apps:
        raise f.error("apps", "expected at least one [[apps]] entry")

    k = f.sub("kubernetes", {})
    k.reject_unknown(set(KubeSettings.__dataclass_fields__))
    namespace = k.str("namespace", "jigsaw")
    if not _DNS_LABEL.match(namespace):
        raise k.error("namespace", f"{namespace!r}: use lowercase letters, digits and '-'")
    kube = KubeSettings(namespace=namespace, image=k.str("image", KubeSettings.image),
                        port=k.integer("port", 8000, low=1, high=65535),
                        gateway=k.str("gateway", KubeSettings.gateway),
                        cpu=_quantity(k, "cpu", KubeSettings.cpu),
                        memory=_quantity(k, "memory", KubeSettings.memory))
    return Fleet(name=f.str("name", path.stem), groups=tuple(groups), apps=tuple(apps),
                 allocation=allocation, space=space, time_limit_s=time_limit, solver=solver,
                 kube=kube, source=str(path))


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def _quantity(f: Fields, key: str, default: str) -> str:
    """A Kubernetes resource quantity ("8", "500m", "32Gi"); a number is taken as is."""
    value = f.raw(key, default)
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _QUANTITY.match(text):
        raise f.error(key, f"expected a Kubernetes quantity such as '8', '500m' or '32Gi', got {value!r}")
    return text
