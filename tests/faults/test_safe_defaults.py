"""Safe defaults of a running node: loopback only, owner-only segments that cannot collide, no pickle."""

from __future__ import annotations

import ast
import contextlib
import os
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
from dpserver import ROOT, Server, write_tiny

from jigsaw.node import ServerSettings
from jigsaw.testing import SHM, jigsawd, shm_entries


def _listening(pid: int, port: int) -> list[str]:
    """Local addresses of ``pid``'s TCP sockets listening on ``port`` (hex, as /proc/net/tcp* has them)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            addr, port_hex = cols[1].rsplit(":", 1)
            if cols[3] == "0A" and int(port_hex, 16) == port and cols[9] in inodes:
                found.append(addr)
    return found


def test_binds_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    assert ServerSettings().host == "127.0.0.1"
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1)])
    server = jigsawd(args, tmp_path / "jigsawd.log", host=None, ready_timeout_s=60.0)  # no --host
    with server:
        assert server.proc is not None
        pid = server.proc.pid
        assert _listening(pid, server.port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 or ::
    assert shm_entries(pid) == []


def test_two_daemons_segments_are_owner_only_and_disjoint(tmp_path: Path) -> None:
    args = write_tiny(tmp_path, tasks=[("a", "classifier", {1: 1.0}, 1), ("b", "classifier", {1: 1.0}, 1)],
                      edges=[("a", "b", 1.0)])
    with Server(args, tmp_path / "one.log") as one, Server(args, tmp_path / "two.log") as two:
        first, second = shm_entries(one.proc.pid), shm_entries(two.proc.pid)  # type: ignore[union-attr]
        assert first and second and not set(first) & set(second)
        for name in first + second:
            assert stat.S_IMODE(os.stat(SHM / name).st_mode) == 0o600, name


def test_no_pickle_eval_or_exec_in_the_package() -> None:
    """Nothing a client or a peer process sends is unpickled or evaluated: the package never does either."""
    banned_modules = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "multiprocessing"}
    banned_calls = {"eval", "exec", "compile", "__import__"}
    found = []
    for path in sorted((ROOT / "src" / "jigsaw").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            if any(n in banned_modules for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {names}")
            call = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            if call in banned_calls:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {call}")
    assert not found, found
