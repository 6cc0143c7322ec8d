"""The rendered nginx configuration on a real nginx (installed by scripts/nginx.sh).

Two small HTTP backends stand in for nodes: nginx must split requests by the plan's weights,
take new weights on a graceful reload without failing a request, and send nothing to a backend
that is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jigsaw.fleet.planner import AppShares, FleetPlan, NodePlan
from jigsaw.fleet.render import render_nginx
from jigsaw.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "nginx.sh"
BACKEND = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
name = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def fleet_plan(shares: dict[str, float], down: tuple[str, ...] = ()) -> FleetPlan:
    nodes = [NodePlan(n, "g", "H100-80GB", 1, {}) for n in shares]
    return FleetPlan("t", "balanced", 1.0, True, nodes, {"app": AppShares(100, 100, 200, shares)},
                     list(down), 0.0, 0.0)


@pytest.fixture(scope="module")
def nginx_ready() -> None:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists() and os.geteuid() != 0:
        pytest.skip("nginx is not installed and installing it needs root")
    r = subprocess.run([str(SCRIPT), "install"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


def post(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_weights_reload_and_a_dead_backend(nginx_ready: None, tmp_path: Path) -> None:
    ports = {"a": free_port(), "b": free_port()}
    backends = {n: subprocess.Popen([sys.executable, "-c", BACKEND, str(p), n]) for n, p in ports.items()}
    folder = tmp_path / "nginx"
    folder.mkdir()
    listen = free_port()
    url = f"http://127.0.0.1:{listen}/v2/models/app/infer"
    addresses = {n: f"127.0.0.1:{p}" for n, p in ports.items()}
    started = False
    try:
        for p in ports.values():
            wait_port(p)
        (folder / "nginx.conf").write_text(render_nginx(fleet_plan({"a": 0.75, "b": 0.25}), addresses,
                                                         listen=f"127.0.0.1:{listen}", prefix=str(folder)))
        r = subprocess.run([str(SCRIPT), "start", str(folder)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        started = True
        wait_port(listen)
        got = [post(url) for _ in range(100)]
        assert all(s == 200 for s, _ in got)
        assert sum(1 for _, n in got if n == "a") == 75  # smooth weighted round robin: exact

        # new weights under load: a graceful reload fails no request
        (folder / "nginx.conf").write_text(render_nginx(fleet_plan({"a": 0.2, "b": 0.8}), addresses,
                                                         listen=f"127.0.0.1:{listen}", prefix=str(folder)))
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, url) for _ in range(200)]
            r = subprocess.run([str(SCRIPT), "reload", str(folder)], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
            during = [f.result() for f in futures]
        assert all(s == 200 for s, _ in during)
        time.sleep(0.5)  # the old worker has finished its requests and exited
        after = [post(url) for _ in range(50)]
        assert sum(1 for _, n in after if n == "a") == 10

        # a backend that is gone: its connections are refused, nginx sends them to the other
        backends["b"].kill()
        backends["b"].wait(timeout=10)
        gone = [post(url) for _ in range(40)]
        assert all(s == 200 and n == "a" for s, n in gone)
    finally:
        if started:
            subprocess.run([str(SCRIPT), "stop", str(folder)], capture_output=True, timeout=60)
        for p in backends.values():
            p.kill()
            p.wait(timeout=10)
