"""What an operator applies for a fleet plan: Kubernetes manifests and the load balancer's routing.

Per node: its entry in the mig-parted ConfigMap the GPU operator's MIG manager reads, the node
label (``nvidia.com/mig.config``) that selects it, and a ``jigsawd`` Deployment pinned to the
node (``kubernetes.io/hostname``) with the node's plan mounted from a ConfigMap, OIP health and
readiness probes, resource requests (CPU, memory and the plan's MIG devices, as the device
plugin's ``mixed`` strategy names them) and Prometheus scrape annotations, plus a Service.
Per app: a Gateway API ``HTTPRoute`` whose backend weights are the plan's shares, and the same
weights as an nginx ``upstream`` (``render_nginx``; the bench runs that file with loopback
addresses). Fleet node names are the Kubernetes node names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from jigsaw.fleet.config import Fleet
from jigsaw.fleet.planner import FleetPlan, NodePlan
from jigsaw.planner.groups import mig_part
from jigsaw.planner.packer import to_mig_parted_yaml

MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_PARTED_CONFIGMAP = "jigsaw-mig-parted"  # the ClusterPolicy's migManager.config.name
GPU_OPERATOR_NAMESPACE = "gpu-operator"
PLAN_MOUNT = "/etc/jigsaw/plan"
NODE_CONFIG_DIR = "/opt/jigsaw/examples"  # where the image keeps the node, app and profile files


def k8s_name(text: str) -> str:
    """A name usable as a Kubernetes object name (RFC 1123): app names may carry '_'."""
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")


def mig_config_name(node: str) -> str:
    return f"jigsaw-{node}"


def _node_mig_configs(fleet: Fleet, plan: FleetPlan) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for n in plan.nodes:
        if n.layout is None:
            continue
        layout = mig_part(n.layout, fleet.group_of(n.name).node)  # a node of several GPU groups: its MIG GPUs
        doc = yaml.safe_load(to_mig_parted_yaml(layout, mig_config_name(n.name)))
        configs.update(doc["mig-configs"])
    return configs


def _mig_resources(fleet: Fleet, n: NodePlan) -> dict[str, str]:
    node = fleet.group_of(n.name).node
    counts: dict[str, int] = {}
    for g in (mig_part(n.layout, node).gpus if n.layout is not None else ()):
        for profile, _ in g.signature:  # a shared instance is one device, of its host profile
            counts[profile] = counts.get(profile, 0) + 1
    out = {f"nvidia.com/mig-{p}": str(c) for p, c in sorted(counts.items())}
    if node.is_mixed and n.layout is not None:  # its GPUs used whole, each all the pod's
        used_whole = {i for grp in node.groups if not grp.model.mig for i in grp.gpus}
        whole = [g for g in n.layout.gpus if g.instances and g.gpu in used_whole]
        if whole:
            out["nvidia.com/gpu"] = str(len(whole))
    return out


def node_plan_json(n: NodePlan) -> str:
    """The file ``jigsawd --plan`` reads: a JSON list with one plan per app of the node."""
    return json.dumps([p.to_json_dict() for p in n.plans()], indent=1) + "\n"


def manifests(fleet: Fleet, plan: FleetPlan) -> dict[str, list[dict[str, Any]]]:
    """File name -> the Kubernetes objects it holds."""
    ns = fleet.kube.namespace
    out: dict[str, list[dict[str, Any]]] = {}
    out["namespace.yaml"] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}]
    mig = {"version": "v1", "mig-configs": _node_mig_configs(fleet, plan)}
    out["mig-parted-config.yaml"] = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": MIG_PARTED_CONFIGMAP, "namespace": GPU_OPERATOR_NAMESPACE},
        "data": {"config.yaml": yaml.safe_dump(mig, sort_keys=False)},
    }]
    for n in plan.nodes:
        out[f"nodes/{n.name}.yaml"] = _node_objects(fleet, n)
    for app in plan.apps:
        out[f"routes/{k8s_name(app)}.yaml"] = [_app_route(fleet, plan, app)]
    return out


def _node_objects(fleet: Fleet, n: NodePlan) -> list[dict[str, Any]]:
    """One node's objects: its MIG config label, its plan ConfigMap, the jigsawd Deployment pinned
    to it and the Service in front of it."""
    kube = fleet.kube
    ns = kube.namespace
    name = f"jigsawd-{n.name}"
    labels = {"app.kubernetes.io/name": "jigsawd", "app.kubernetes.io/part-of": k8s_name(fleet.name),
              "jigsaw/node": n.name}
    port = kube.port
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
              "prometheus.io/path": "/metrics"}
    return [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": n.name, "labels": {MIG_CONFIG_LABEL: mig_config_name(n.name)}}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": f"{name}-plan", "namespace": ns, "labels": labels},
         "data": {"plan.json": node_plan_json(n)}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": name, "namespace": ns, "labels": labels},
         "spec": {
             "replicas": 1,
             # one jigsawd owns the node's MIG devices: the old pod must go before the new one
             "strategy": {"type": "Recreate"},
             "selector": {"matchLabels": {"jigsaw/node": n.name}},
             "template": {
                 "metadata": {"labels": labels, "annotations": scrape},
                 "spec": {
                     "nodeSelector": {"kubernetes.io/hostname": n.name},
                     "terminationGracePeriodSeconds": 30,
                     "containers": [_jigsawd_container(fleet, n)],
                     "volumes": [{"name": "plan", "configMap": {"name": f"{name}-plan"}},
                                 {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": scrape},
         "spec": {"selector": {"jigsaw/node": n.name},
                  "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}},
    ]


def _jigsawd_container(fleet: Fleet, n: NodePlan) -> dict[str, Any]:
    """The jigsawd container of a node's pod: its node file and plan, probes on OIP's health
    endpoints, CPU, memory and the node's MIG devices as resources."""
    kube = fleet.kube
    port = kube.port
    node_file = f"{NODE_CONFIG_DIR}/{Path(fleet.group_of(n.name).node.source).name}"
    requests = {"cpu": kube.cpu, "memory": kube.memory, **_mig_resources(fleet, n)}
    limits = {k: v for k, v in requests.items() if k.startswith("nvidia.com/")}
    return {
        "name": "jigsawd", "image": kube.image,
        "command": ["jigsawd", "--node-config", node_file, "--plan", f"{PLAN_MOUNT}/plan.json",
                    "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"},
                          "initialDelaySeconds": 10, "periodSeconds": 5, "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"},
                         "periodSeconds": 2, "failureThreshold": 90},
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _app_route(fleet: Fleet, plan: FleetPlan, app: str) -> dict[str, Any]:
    """The Gateway API HTTPRoute that splits an app's requests over the nodes by the plan's weights."""
    kube = fleet.kube
    weights = plan.weights(app)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": f"jigsaw-{k8s_name(app)}", "namespace": kube.namespace},
        "spec": {
            "parentRefs": [{"name": kube.gateway}],
            "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": f"/v2/models/{app}"}}],
                "backendRefs": [{"name": f"jigsawd-{n}", "port": kube.port, "weight": w}
                                for n, w in weights.items()],
            }],
        },
    }


def render_nginx(plan: FleetPlan, addresses: dict[str, str], *, listen: str = "0.0.0.0:80",
                 prefix: str | None = None) -> str:
    """An nginx configuration routing each app's OIP paths to its nodes with the plan's weights.

    ``addresses``: node -> ``host:port``. A node that refuses a connection is marked failed for
    a while (``max_fails``/``fail_timeout``) and the request goes to the next one: nginx never
    sends a request twice once it reached a node (a POST is not idempotent), so only requests in
    flight on a node that dies can fail. No upstream keepalive: a cached connection the node
    closed would fail a POST that nginx may not resend. ``prefix``: a folder for the pid, logs and temp files
    (to run it as an unprivileged, self-contained process); None for a packaged install.
    """
    lines = []
    if prefix is not None:
        lines += [f"pid {prefix}/nginx.pid;", f"error_log {prefix}/error.log warn;"]
    lines += ["worker_processes 1;", "worker_rlimit_nofile 65536;",
              "events { worker_connections 16384; }", "http {",
              "    access_log off;", "    client_max_body_size 64m;",
              "    proxy_http_version 1.1;", "    proxy_read_timeout 120s;",
              "    proxy_next_upstream error timeout;",
              # which node answered: the bench attributes every answer with it
              "    add_header X-Jigsaw-Upstream $upstream_addr always;"]
    if prefix is not None:
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            lines.append(f"    {kind}_temp_path {prefix}/{kind}_temp;")
    live = [n.name for n in plan.nodes if n.name in addresses]
    for app in plan.apps:
        weights = {n: w for n, w in plan.weights(app).items() if n in addresses}
        lines.append(f"    upstream jigsaw_{app} {{")
        if not weights:  # nothing serves it: every request is answered 502 by nginx at once
            lines.append("        server 127.0.0.1:9 down;")
        for n, w in weights.items():
            lines.append(f"        server {addresses[n]} weight={w} max_fails=1 fail_timeout=10s;")
        lines.append("    }")
    lines.append("    upstream jigsaw_any {")
    for n in live:
        lines.append(f"        server {addresses[n]} max_fails=1 fail_timeout=10s;")
    if not live:
        lines.append("        server 127.0.0.1:9 down;")
    lines += ["    }", "    server {", f"        listen {listen};"]
    for app in plan.apps:
        lines += [f"        location /v2/models/{app}/ {{ proxy_pass http://jigsaw_{app}; }}",
                  f"        location = /v2/models/{app} {{ proxy_pass http://jigsaw_{app}; }}"]
    lines += ["        location / { proxy_pass http://jigsaw_any; }", "    }", "}"]
    return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    """Plain YAML for people and kubectl: no anchors for repeated labels, files as blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    if "\n" in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", text)


_Dumper.add_representer(str, _str)


def to_yaml(objs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False)


def write_manifests(fleet: Fleet, plan: FleetPlan, out_dir: str | Path) -> list[Path]:
    """Writes every manifest, the nginx configuration, the per-node plans and the fleet plan."""
    out = Path(out_dir)
    written: list[Path] = []

    def put(rel: str, text: str) -> None:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)

    for rel, objs in manifests(fleet, plan).items():
        put(rel, to_yaml(objs))
    addresses = {n.name: f"jigsawd-{n.name}.{fleet.kube.namespace}.svc.cluster.local:{fleet.kube.port}"
                 for n in plan.nodes}
    put("nginx/nginx.conf", render_nginx(plan, addresses))
    for n in plan.nodes:
        put(f"plans/{n.name}.json", node_plan_json(n))
    put("fleet-plan.json", json.dumps(plan.to_json_dict(), indent=1) + "\n")
    return written
