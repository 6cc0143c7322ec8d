"""Real server processes for the tests and the benches: one launcher, one ``free_port``.

``ServerProcess`` starts a command in its own process group, waits until a URL answers 200, and on
``close`` sends SIGTERM, waits, SIGKILLs whatever of the group is left (workers included) and
removes (and returns) the shared-memory segments the process left behind, so a failing test or
an interrupted bench does not leak into the next one. ``jigsawd`` builds one for the daemon on
127.0.0.1 and a free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import BinaryIO

import jigsaw

SHM = Path("/dev/shm")
SRC = Path(jigsaw.__file__).resolve().parents[1]  # the tree this process imports jigsaw from
READY_PATH = "/v2/health/ready"


class ServerError(RuntimeError):
    """The server exited before it was ready, was not ready in time, or did not stop in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shm_entries(pid: int) -> list[str]:
    """The ``/dev/shm`` entries a daemon of ``pid`` named (its segments and semaphores)."""
    tag = f"jigsaw-{pid}-"
    return sorted(e for e in os.listdir(SHM) if e.startswith(tag) or e.startswith("sem." + tag))


class ServerProcess:
    """One server subprocess in its own process group; a context manager that always cleans up."""

    def __init__(self, cmd: list[str], port: int, log_path: Path, *, ready_path: str = READY_PATH,
                 name: str = "server", ready_timeout_s: float = 90.0, cwd: Path | None = None,
                 env: dict[str, str] | None = None, poll_s: float = 0.1) -> None:
        self.args = cmd
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.log_path = log_path
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self.cwd = cwd
        self.env = env or {}  # set on top of this process's environment
        self.poll_s = poll_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0
        self._log_file: BinaryIO | None = None
        self._closed = False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> ServerProcess:
        """Start it and wait until ``url + ready_path`` answers 200; else clean up, ``ServerError``."""
        path = [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = dict(os.environ, **self.env, PYTHONPATH=os.pathsep.join(path))
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed by close()
        self._log_file = log
        self._closed = False
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(f"{self.name} exited with {self.proc.returncode} before ready:\n"
                                      f"{self.log()}")
                ready = self.url + self.ready_path
                with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        break
                if time.monotonic() - t0 > self.ready_timeout_s:
                    raise ServerError(f"{self.name} not ready after {self.ready_timeout_s:g} s:\n"
                                      f"{self.log()}")
                time.sleep(self.poll_s)
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait (the graceful path); ``ServerError`` after SIGKILLing the group if it hangs."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise ServerError(f"{self.name} did not stop within {timeout_s:g} s:\n{self.log()}") from None

    def close(self, timeout_s: float = 30.0) -> list[str]:
        """Stop it, kill what is left of its group and remove its leftover segments; returns them.

        ``proc`` stays set (its pid and exit status remain readable); a second call does nothing.
        """
        if self.proc is None or self._closed:
            return []
        self._closed = True
        pid = self.proc.pid
        try:
            self.stop(timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # any worker left behind
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        left = shm_entries(pid)
        for e in left:
            with contextlib.suppress(FileNotFoundError):
                (SHM / e).unlink()
        return left

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def jigsawd_command(args: list[str], port: int, *, emulate: bool = True,
                   host: str | None = "127.0.0.1", grpc_port: int | None = 0) -> list[str]:
    """``python -m jigsaw.daemon args`` (``--emulate`` unless told otherwise) on ``port``.

    ``host=None`` leaves the bind address to the node's configuration (what a user gets).
    ``grpc_port``: the gRPC port (0: off, so servers started side by side do not all ask for
    8001; None: the node's ``server.grpc_port``).
    """
    cmd = [sys.executable, "-m", "jigsaw.daemon", *args]
    if emulate:
        cmd.append("--emulate")
    if host is not None:
        cmd += ["--host", host]
    if grpc_port is not None and "--grpc-port" not in args:
        cmd += ["--grpc-port", str(grpc_port)]
    return [*cmd, "--port", str(port)]


def jigsawd(args: list[str], log_path: Path, *, emulate: bool = True, host: str | None = "127.0.0.1",
            ready_timeout_s: float = 90.0, cwd: Path | None = None,
            env: dict[str, str] | None = None, grpc_port: int | None = 0) -> ServerProcess:
    """A ``ServerProcess`` running jigsawd on a free port (see ``jigsawd_command``)."""
    port = free_port()
    return ServerProcess(jigsawd_command(args, port, emulate=emulate, host=host, grpc_port=grpc_port), port,
                         log_path,
                         name="jigsawd", ready_timeout_s=ready_timeout_s, cwd=cwd, env=env)
