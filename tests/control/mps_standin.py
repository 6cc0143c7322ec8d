"""A stand-in for ``nvidia-cuda-mps-control`` on an emulated node (``JIGSAW_MPS_CONTROL``): it
makes and removes the control pipe, logs each call with the daemon's clients at that moment, and
fails its next start when the test leaves a ``fail_next`` file in its directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FAKE_MPS = """#!{python}
# A stand-in for nvidia-cuda-mps-control: "-d" makes the control pipe, "quit" on stdin removes it.
# Each call is logged with the worker processes that are the daemon's clients at that moment.
import json, os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
mine = ("CUDA_MPS_PIPE_DIRECTORY=" + pipe).encode()
def clients():
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{{pid}}/cmdline", "rb").read()
            env = open(f"/proc/{{pid}}/environ", "rb").read().split(b"\\0")
        except OSError:
            continue
        n += b"jigsaw.runtime.worker" in cmd and mine in env
    return n
op = "start" if sys.argv[1:] == ["-d"] else sys.stdin.read().strip()
flag = os.environ["FAKE_MPS_DIR"] + "/fail_next"
if op == "start":
    if os.path.exists(flag):  # the test asks for one failing start
        os.unlink(flag)
        print("cannot start: permission denied", file=sys.stderr)
        sys.exit(1)
    open(os.path.join(pipe, "control"), "w").close()
elif op == "quit":
    try:
        os.unlink(os.path.join(pipe, "control"))
    except FileNotFoundError:
        pass
mode = oct(os.stat(os.path.dirname(pipe)).st_mode & 0o777)
with open(os.environ["FAKE_MPS_DIR"] + "/log", "a") as f:
    f.write(json.dumps({{"op": op, "pipe": pipe, "clients": clients(), "mode": mode,
                        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}}) + "\\n")
"""


def fake_mps(tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "fake-mps-control"
    script.write_text(FAKE_MPS.format(python=sys.executable))
    script.chmod(0o755)
    return {"JIGSAW_MPS_CONTROL": str(script), "FAKE_MPS_DIR": str(tmp_path)}


def mps_log(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


Log = list[dict[str, Any]]


def serve_under_mps(args: list[str], tmp_path: Path
                    ) -> tuple[dict[str, Any], dict[int, list[bytes]], Log, Log]:
    """Runs ``jigsawd args`` with the stand-in MPS control: its ``/admin/layout``, each process's
    environment, and the stand-in's log while it serves and after it stopped."""
    from dpserver import Server, http

    with Server(args, tmp_path / "jigsawd.log", env=fake_mps(tmp_path)) as server:
        status, layout, _ = http("GET", f"{server.url}/admin/layout")
        assert status == 200, layout
        environ = {p["pid"]: Path(f"/proc/{p['pid']}/environ").read_bytes().split(b"\0")
                   for p in layout["processes"]}
        during = mps_log(tmp_path)
    return layout, environ, during, mps_log(tmp_path)
