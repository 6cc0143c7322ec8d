"""The fleet planner and its manifests, on the example nodes with a small, fast app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jigsaw.errors import ConfigError
from jigsaw.fleet.config import load_fleet
from jigsaw.fleet.planner import WEIGHT_SCALE, fleet_capacity, plan_fleet
from jigsaw.fleet.render import manifests, render_nginx, write_manifests
from jigsaw.node import load_node_profiles
from jigsaw.planner.packer import validate_layout
from jigsaw.planner.verify import verify_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def write_fleet(tmp_path: Path, body: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(body.replace("@EX@", str(EXAMPLES)))
    return path


HETERO = """
name = "t"
time_limit_s = 5.0
solver = "highs"
[[nodes]]
name = "h100"
node = "@EX@/h100x4.toml"
gpus = 1
count = 2
[[nodes]]
name = "a100"
node = "@EX@/a100x4.toml"
gpus = 1
count = 1
[[apps]]
name = "social_media"
demand_rps = 1500
"""


@pytest.fixture(scope="module")
def hetero(tmp_path_factory: pytest.TempPathFactory):
    fleet = load_fleet(write_fleet(tmp_path_factory.mktemp("fleet"), HETERO))
    plan, curves = plan_fleet(fleet)
    return fleet, plan, curves


def test_heterogeneous_fleet_splits_demand_by_capacity(hetero) -> None:
    fleet, fp, curves = hetero
    shares = fp.apps["social_media"]
    assert fp.feasible and shares.planned_rps == pytest.approx(1500)
    assert sum(shares.shares.values()) == pytest.approx(1.0)
    assert set(shares.shares) == {"h100-0", "h100-1", "a100-0"}
    caps = {(g, a): pts[1].capacity_rps for (g, a), pts in curves.points.items()}
    assert caps[("h100", "social_media")] != caps[("a100", "social_media")]  # the GPUs differ
    # balanced: every node at the same utilization, each within its capacity
    util = {n.name: n.apps["social_media"].share_rps / n.apps["social_media"].capacity_rps for n in fp.nodes}
    assert max(util.values()) == pytest.approx(min(util.values()))
    assert max(util.values()) <= 1.0
    assert fleet_capacity(fleet, "social_media", curves) == pytest.approx(shares.capacity_rps)
    # every node's plan is a sound plan for its share on its own GPUs
    for n in fp.nodes:
        group = fleet.group_of(n.name)
        app = group.node.app("social_media")
        (p,) = n.plans()
        assert p.gpu_model == group.node.gpu.name
        assert p.planned_rps == pytest.approx(n.apps["social_media"].share_rps, rel=1e-6)
        profiles = load_node_profiles(group.node, [app])
        assert verify_plan(p, app, group.node, profiles) == []
        assert validate_layout(n.layout, group.node.gpu) == []


def test_a_down_node_gets_nothing_and_the_others_take_its_share(hetero) -> None:
    fleet, fp, curves = hetero
    down, _ = plan_fleet(fleet, down={"h100-1"}, curves=curves, plan_nodes=False)
    shares = down.apps["social_media"].shares
    assert "h100-1" not in shares and [n.name for n in down.nodes] == ["h100-0", "a100-0"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["h100-0"] > fp.apps["social_media"].shares["h100-0"]
    with pytest.raises(Exception, match="no node named"):
        plan_fleet(fleet, down={"nope-0"}, curves=curves, plan_nodes=False)


def test_above_capacity_serves_the_maximum(hetero) -> None:
    fleet, fp, curves = hetero
    cap = fp.apps["social_media"].capacity_rps
    over, _ = plan_fleet(fleet.with_demand({"social_media": 3 * cap}), curves=curves, plan_nodes=False)
    assert not over.feasible
    assert over.apps["social_media"].planned_rps == pytest.approx(cap)
    assert over.headroom == pytest.approx(1 / 3, rel=1e-6)
    assert any("above the fleet's capacity" in n for n in over.notes)


def test_two_apps_get_disjoint_gpus_of_a_node(tmp_path: Path) -> None:
    fleet = load_fleet(write_fleet(tmp_path, """
allocation = "fewest-slices"
time_limit_s = 5.0
solver = "highs"
[[nodes]]
name = "n"
node = "@EX@/h100x4.toml"
gpus = 2
count = 2
[[apps]]
name = "social_media"
demand_rps = 300
[[apps]]
name = "ar_assistant"
demand_rps = 20
"""))
    fp, curves = plan_fleet(fleet)
    assert fp.feasible
    for app in ("social_media", "ar_assistant"):
        assert sum(fp.apps[app].shares.values()) == pytest.approx(1.0)
    for n in fp.nodes:
        assert sum(a.gpus for a in n.apps.values()) <= 2
        used = {}
        for a in n.apps.values():
            for g in a.plan.layout.gpus:
                if g.instances:
                    assert a.gpu_offset <= g.gpu < a.gpu_offset + a.gpus
                    assert used.setdefault(g.gpu, a.app) == a.app  # no GPU shared by two apps
        assert validate_layout(n.layout, fleet.groups[0].node.gpu) == []
    # fewest slices: no configuration serving both demands uses fewer slices
    total = sum(curves.points[("n", a)][g].slices_used for n in fp.nodes for a, g in
                ((x.app, x.gpus) for x in n.apps.values()))
    assert total <= 2 * 14


def test_manifests_validate_and_weights_equal_the_shares(hetero, tmp_path: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    fleet, fp, _ = hetero
    written = write_manifests(fleet, fp, tmp_path / "k8s")
    kinds: dict[str, int] = {}
    for path in written:
        if path.suffix != ".yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
            if doc["kind"] == "HTTPRoute":  # a Gateway API CRD: not in the Kubernetes schemas
                continue
            kv.validate(doc, "1.30.0", strict=True)
    assert kinds == {"Namespace": 1, "ConfigMap": 1 + 3, "Node": 3, "Deployment": 3, "Service": 3,
                     "HTTPRoute": 1}
    objs = manifests(fleet, fp)
    (route,) = objs["routes/social-media.yaml"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    (rule,) = route["spec"]["rules"]
    assert rule["matches"][0]["path"] == {"type": "PathPrefix", "value": "/v2/models/social_media"}
    weights = {b["name"].removeprefix("jigsawd-"): b["weight"] for b in rule["backendRefs"]}
    total = sum(weights.values())
    for node, share in fp.apps["social_media"].shares.items():
        assert weights[node] / total == pytest.approx(share, abs=1 / WEIGHT_SCALE)
    # per node: the MIG config label, the plan mounted, probes on the OIP endpoints, pinned
    node_doc, cm, dep, svc = objs["nodes/h100-0.yaml"]
    label = node_doc["metadata"]["labels"]["nvidia.com/mig.config"]
    mig = yaml.safe_load(objs["mig-parted-config.yaml"][0]["data"]["config.yaml"])
    assert label in mig["mig-configs"]
    plans = json.loads(cm["data"]["plan.json"])
    assert [p["app"] for p in plans] == ["social_media"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "h100-0"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    mig_requests = {k: int(v) for k, v in c["resources"]["requests"].items()
                    if k.startswith("nvidia.com/mig-")}
    assert sum(mig_requests.values()) == sum(len(g.instances) for g in fp.node("h100-0").layout.gpus)
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_nginx_config_carries_the_weights(hetero) -> None:
    _, fp, _ = hetero
    addresses = {"h100-0": "127.0.0.1:9001", "a100-0": "127.0.0.1:9003"}  # h100-1 has no address
    conf = render_nginx(fp, addresses, listen="127.0.0.1:8080")
    w = fp.weights("social_media")
    assert f"server 127.0.0.1:9001 weight={w['h100-0']} " in conf
    assert f"server 127.0.0.1:9003 weight={w['a100-0']} " in conf
    assert "9002" not in conf
    assert "location /v2/models/social_media/ { proxy_pass http://jigsaw_social_media; }" in conf


def test_fleet_file_errors_name_file_and_field(tmp_path: Path) -> None:
    cases = {
        'allocation = "most"': "allocation",
        '[[nodes]]\nname = "Bad_Name"\nnode = "@EX@/h100x4.toml"': "nodes[0].name",
        '[[nodes]]\nname = "a"\nnode = "@EX@/h100x4.toml"\n[[apps]]\nname = "nope"\ndemand_rps = 1':
            "apps[0].name",
        '[[nodes]]\nname = "a"\nnode = "@EX@/h100x4.toml"\n[[apps]]\nname = "social_media"\ndemand_rps = -1':
            "apps[0].demand_rps",
        '[[nodes]]\nname = "a"\nnode = "@EX@/h100x4.toml"\ncount = 0': "nodes[0].count",
        'name = "x"': "nodes",
        '[[nodes]]\nname = "a"\nnode = "@EX@/h100x4.toml"\n[[apps]]\nname = "social_media"\ndemand_rps = 1\n'
        '[kubernetes]\ncpu = "lots"': "kubernetes.cpu",
    }
    for i, (body, field) in enumerate(cases.items()):
        path = write_fleet(tmp_path, body, f"f{i}.toml")
        with pytest.raises(ConfigError) as err:
            load_fleet(path)
        assert str(path) in str(err.value) and field in str(err.value), str(err.value)
    r = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--fleet", str(tmp_path / "f0.toml")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "allocation" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--app", "social_media"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "--node" in r.stderr and "Traceback" not in r.stderr


def test_cli_renders_a_fleet(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path, HETERO.replace("count = 2", "count = 1"))
    r = subprocess.run([sys.executable, "-m", "jigsaw.cli", "k8s", "render", "--fleet", str(fleet),
                        "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for rel in ("namespace.yaml", "mig-parted-config.yaml", "nodes/h100-0.yaml", "nodes/a100-0.yaml",
                "routes/social-media.yaml", "nginx/nginx.conf", "plans/h100-0.json", "fleet-plan.json"):
        assert (tmp_path / "out" / rel).is_file(), rel
    r = subprocess.run([sys.executable, "-m", "jigsaw.cli", "plan", "--fleet", str(fleet), "--json",
                        "--down", "a100-0"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["down"] == ["a100-0"] and doc["apps"]["social_media"]["shares"] == {"h100-0": 1.0}


def test_a_fleet_of_gpus_given_by_their_figures(tmp_path: Path) -> None:
    """L4 and A10 nodes (no GPU table, MPS shares): the fleet splits the demand and counts their slices."""
    path = write_fleet(tmp_path, """
name = "speech"
time_limit_s = 5.0
solver = "highs"
[[nodes]]
name = "l4"
node = "@EX@/l4x2.toml"
gpus = 2
count = 1
[[nodes]]
name = "a10"
node = "@EX@/a10x1.toml"
gpus = 1
count = 1
[[apps]]
name = "voice_intent"
demand_rps = 300
""")
    fp, _ = plan_fleet(load_fleet(path))
    assert fp.feasible and {n.gpu_model for n in fp.nodes} == {"L4", "A10"}
    assert {n.name: n.slices_available for n in fp.nodes} == {"l4-0": 8, "a10-0": 4}
    assert sum(fp.apps["voice_intent"].shares.values()) == pytest.approx(1.0)
    fleet = load_fleet(path)
    for n in fp.nodes:
        node = fleet.group_of(n.name).node
        for entry in n.apps.values():
            assert entry.plan is not None and entry.plan.instances
            assert verify_plan(entry.plan, node.app("voice_intent"), node, load_node_profiles(node)) == []
