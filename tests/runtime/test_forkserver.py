"""The fork server (``runtime/forkserver.py``) on its own: real zygotes and forked worker processes
(spares: ``--spare --control FILE``, ready once ``<control>.ready`` exists). Every process a test
starts is killed in its clean-up, also when it fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jigsaw.runtime.forkserver import UNKNOWN_STATUS, ZYGOTE_NAME, ForkedProcess, ForkServer, popen_worker
from jigsaw.testing import SRC

BOUND_S = 30.0


def _until(what: str, ok: Callable[[], bool], timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"{what} after {timeout_s:g} s"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """A process that runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signals(pid: int) -> dict[str, str]:
    """The main thread's blocked, ignored and caught signals (/proc/<pid>/status)."""
    rows = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ":\t" in line)
    return {k: rows[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")}


# rt_sigtimedwait's number, where /proc/<pid>/wchan does not name the kernel function
_SIGTIMEDWAIT = {"x86_64": 128, "aarch64": 137}.get(os.uname().machine)


def _in_sigwait(pid: int) -> bool:
    """Whether the process's main thread sleeps in ``sigwait`` (a spare waiting for its spec).

    Only there is its signal mask comparable: while it sleeps, the kernel unblocks the signals it
    waits for in the mask /proc shows (``do_sigtimedwait`` keeps the real one aside), so a spare
    that has just marked itself ready, not yet in ``sigwait``, shows SIGHUP and SIGTERM blocked and
    one that waits shows them not (seen under load: the exec'd spare read in that window)."""
    with contextlib.suppress(OSError):
        if "sigtimedwait" in Path(f"/proc/{pid}/wchan").read_text():
            return True
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/syscall").read_text().split()[0]) == _SIGTIMEDWAIT
    return False


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture()
def server() -> Iterator[ForkServer]:
    fs = ForkServer()
    started: list[int] = []
    real_spawn = fs.spawn

    def spawn(*a, **k):  # type: ignore[no-untyped-def]
        p = real_spawn(*a, **k)
        started.append(p.pid)
        return p
    fs.spawn = spawn  # type: ignore[method-assign]
    try:
        assert fs.start(), "the fork server did not get ready"
        yield fs
    finally:
        fs.close()
        for pid in started:
            _kill(pid)


def _spare(fs: ForkServer, where: Path, name: str = "spare") -> tuple[ForkedProcess, Path]:
    control = where / f"{name}.json"
    proc = fs.spawn(["--spare", "--control", str(control)])
    assert isinstance(proc, ForkedProcess)
    _until("the spare is not ready",
           lambda: control.with_suffix(".ready").exists() or proc.poll() is not None)
    assert proc.poll() is None, proc.returncode
    return proc, control


def test_a_forked_worker_starts_clean(server: ForkServer, tmp_path: Path) -> None:
    proc, control = _spare(server, tmp_path)
    assert Path(f"/proc/{server.pid}/comm").read_bytes().strip() == ZYGOTE_NAME
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    assert int(stat.rsplit(")", 1)[1].split()[1]) == server.pid  # forked by the zygote
    assert stat.startswith(f"{proc.pid} (jigsaw-spare)")  # the worker's own name again, then its spare name
    argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert argv[1:] == [b"-m", b"jigsaw.runtime.worker", b"--spare", b"--control", os.fsencode(control)]  # ps
    # stdio and the daemon's pidfd only: not the zygote's socket, not its wake-up pipe
    fds = {int(fd): os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")}
    assert set(fds) - {0, 1, 2} == {3} and "pidfd" in fds[3], fds
    # the signal state of a spare started with a Python start (the zygote's SIGCHLD handler gone)
    exec_control = tmp_path / "exec.json"
    started = popen_worker(["--spare", "--control", str(exec_control)])
    try:
        _until("the exec'd spare is not ready", lambda: exec_control.with_suffix(".ready").exists())
        _until("a spare does not wait for its spec in sigwait",
               lambda: _in_sigwait(proc.pid) and _in_sigwait(started.pid))
        assert _signals(proc.pid) == _signals(started.pid)
    finally:
        started.kill()
        started.wait()
    proc.terminate()
    assert proc.wait(timeout=BOUND_S) == 0  # a spare stopped while idle exits 0
    assert proc.poll() == 0 and proc.returncode == 0


def test_exit_statuses_come_from_the_zygote(server: ForkServer, tmp_path: Path) -> None:
    bad = server.spawn([])  # the worker's own argument check: exit status 2
    assert isinstance(bad, ForkedProcess)
    assert bad.wait(timeout=BOUND_S) == 2
    proc, _ = _spare(server, tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.05)
    proc.kill()
    assert proc.wait(timeout=BOUND_S) == -signal.SIGKILL
    proc.kill()  # a process that has exited is not signalled again (no recycled pid)
    assert server.forks_total == 2 and server.fallbacks_total == 0


def test_the_working_directory_is_the_callers(server: ForkServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    proc = server.spawn(["--spare", "--control", "relative.json"])
    _until("the spare is not ready", lambda: (tmp_path / "relative.ready").exists())
    proc.terminate()
    assert proc.wait(timeout=BOUND_S) == 0


def test_the_environment_is_the_requested_one(tmp_path: Path) -> None:
    # argparse wraps the worker's --help at $COLUMNS: what the child's os.environ says. The zygote
    # (and so each child) writes to the stdout it was started with: a file here
    out_path = tmp_path / "out.txt"
    saved = os.dup(1)
    fs = ForkServer()
    try:
        with out_path.open("ab") as f:
            os.dup2(f.fileno(), 1)
            try:
                assert fs.start()
            finally:
                os.dup2(saved, 1)
        seen = 0
        for columns in (40, 400):
            proc = fs.spawn(["--help"], dict(os.environ, COLUMNS=str(columns)))
            assert proc.wait(timeout=BOUND_S) == 0
            text = out_path.read_text()[seen:]
            seen += len(text)
            assert "--control CONTROL" in text
            width = max(len(line) for line in text.splitlines())
            assert width <= columns if columns == 40 else width > 40, (columns, text)
    finally:
        os.close(saved)
        fs.close()


def test_a_killed_zygote_is_started_again_and_popen_serves_meanwhile(server: ForkServer,
                                                                     tmp_path: Path) -> None:
    before, _ = _spare(server, tmp_path, "before")
    first = server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    _until("the zygote did not die", lambda: not _alive(first))
    during = server.spawn(["--spare", "--control", str(tmp_path / "during.json")])
    assert isinstance(during, subprocess.Popen)  # the fallback: a Python start
    assert server.restarts_total == 1 and server.fallbacks_total == 1
    assert before.poll() is None  # the zygote's children live on: they watch the daemon, not it
    _until("the new zygote is not ready", server.up)
    assert server.pid not in (None, first)
    after, _ = _spare(server, tmp_path, "after")
    _until("the fallback spare is not ready", lambda: (tmp_path / "during.ready").exists())
    for p in (during, after):
        p.terminate()
        assert p.wait(timeout=BOUND_S) == 0
    before.kill()  # its zygote died before it: nobody can tell its status
    assert before.wait(timeout=BOUND_S) == UNKNOWN_STATUS
    text = server.prometheus()
    assert "jigsaw_fork_server_restarts_total 1\n" in text
    assert "jigsaw_fork_server_fallbacks_total 1\n" in text
    assert "jigsaw_fork_server_up 1\n" in text


DAEMON = """
import sys, time
from pathlib import Path
from jigsaw.runtime.forkserver import ForkServer
fs = ForkServer()
assert fs.start()
control = Path(sys.argv[1])
p = fs.spawn(["--spare", "--control", str(control)])
deadline = time.monotonic() + 30
while not control.with_suffix(".ready").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
print(fs.pid, p.pid, flush=True)
time.sleep(60)
"""


def test_the_zygote_and_its_children_die_with_the_daemon(tmp_path: Path) -> None:
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(tmp_path / "s.json")],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(SRC)))
    pids: list[int] = []
    try:
        assert daemon.stdout is not None
        pids = [int(x) for x in daemon.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids), pids
        daemon.kill()  # no clean-up of its own: the kernel and the children's watch must do it
        daemon.wait(timeout=BOUND_S)
        _until("the zygote or a worker outlived the daemon", lambda: not any(_alive(p) for p in pids))
    finally:
        daemon.kill()
        daemon.wait()
        for pid in pids:
            _kill(pid)


def test_workers_start_and_are_waited_for_past_fd_setsize(tmp_path: Path) -> None:
    """A daemon with thousands of client connections numbers its zygote socket and its workers'
    pidfds past select's FD_SETSIZE (1024); forking, polling and waiting still work there."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1100 + 64
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    fs = ForkServer()
    proc: ForkedProcess | None = None
    try:
        assert fs.start(), "the fork server did not get ready"
        assert fs._zygote is not None and fs._zygote.sock.fileno() >= 1024
        proc, _ = _spare(fs, tmp_path)
        assert proc._pidfd >= 1024
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        proc.kill()
        assert proc.wait(timeout=BOUND_S) == -signal.SIGKILL
    finally:
        fs.close()
        if proc is not None:
            _kill(proc.pid)
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
