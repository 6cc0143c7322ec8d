"""The fork server (zygote): worker processes started in milliseconds instead of a Python start.

A re-plan that starts processes used to run ``python -m jigsaw.runtime.worker`` once per new
process: an interpreter start and the worker's imports, 0.3-0.5 s of CPU each, all at once on
the switch's path (29 of them on a 2-core host take seconds). The daemon instead starts one
process at start-up, ``python -m jigsaw.runtime.forkserver``, that imports the worker module and
the backend's pure-Python dependencies once and then forks a worker per request. It never
initialises a device: a child loads its backend (and CUDA, its engines) after the fork, with the
environment it was given, exactly as a freshly executed worker does. On a GPU node that load
still costs what it costs (a CUDA context, an engine): the fork saves the interpreter and the
imports, not the device's start.

Protocol, over a ``SOCK_SEQPACKET`` Unix socket pair (one JSON document per message, no pickle):

- zygote -> daemon, once: ``{"ready": pid}`` when its imports are done;
- daemon -> zygote: ``{"id": n, "argv": [...], "env": {...}, "cwd": "..."}``: fork a worker
  (``argv``: the worker's arguments, ``env``: its whole environment, CUDA_VISIBLE_DEVICES, MPS
  directories and CPU pinning included, set before its backend loads);
- zygote -> daemon: ``{"id": n, "pid": p}`` with the child's pidfd attached (``SCM_RIGHTS``), or
  ``{"id": n, "error": "..."}``;
- zygote -> daemon: ``{"exit": p, "status": s}`` when it has reaped a child (``Popen.returncode``
  convention: a negative status is the signal that ended it).

The daemon holds each child as a ``ForkedProcess``: the ``subprocess.Popen`` surface the
generations, the supervisor and the spare pool use (``pid``, ``poll``, ``returncode``, ``wait``,
``send_signal``, ``terminate``, ``kill``), its liveness from the pidfd (no pid-reuse race), its
exit status from the zygote's report.

A child starts clean: every descriptor but stdio and the daemon's pidfd closed, default signal
handlers, an empty signal mask, no event loop (the zygote never makes one), reseeded random
number generators (``random`` by Python's own at-fork hook, numpy's global one here), the
requested environment and working directory, its command line (``ps``) and process name the
worker's. It dies with the daemon, not with the zygote: a
thread blocked on the daemon's pidfd SIGKILLs the child when the daemon exits, so a zygote that
crashes takes no worker down with it (its orphans' exit statuses are then unknown:
``UNKNOWN_STATUS``). The zygote itself dies with the daemon (``PR_SET_PDEATHSIG``, and it
watches the daemon's pidfd and its socket's EOF).

If the zygote dies, ``ForkServer.spawn`` starts that process with ``subprocess.Popen`` (today's
path) and starts a new zygote, which serves once its imports are done. ``[server] fork_server``
(on by default) switches it; ``/metrics`` counts forks, fallbacks and restarts.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

ZYGOTE_NAME = b"jigsaw-zygote"  # its /proc/<pid>/comm
UNKNOWN_STATUS = 255  # the exit status of a child whose zygote died before reporting it
WORKER_MODULE = "jigsaw.runtime.worker"
READY_TIMEOUT_S = 60.0  # the zygote's imports at start-up
REPLY_TIMEOUT_S = 10.0  # one fork
EXIT_REPORT_WAIT_S = 1.0  # a child's pidfd says it exited; its status follows from the zygote
WAIT_SLICE_S = 0.1  # ``wait`` re-checks at least this often
STOP_TIMEOUT_S = 2.0
MAX_MESSAGE = 1 << 20  # one request (the environment is the biggest part)
CMDLINE_ROOM = 2048  # bytes of the zygote's command line its children rewrite as their own


class WorkerProcess(Protocol):
    """What the daemon uses of a worker process: ``subprocess.Popen`` or ``ForkedProcess``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def popen_worker(args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A worker process started the usual way: ``python -m jigsaw.runtime.worker *args``."""
    return subprocess.Popen([sys.executable, "-m", WORKER_MODULE, *args], stdin=subprocess.DEVNULL,
                            env=None if env is None else dict(env))


class Launcher(Protocol):
    """Starts worker processes (``ForkServer``; None in the callers: ``popen_worker``)."""

    def spawn(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> WorkerProcess: ...


def launch(launcher: Launcher | None, args: Sequence[str],
           env: Mapping[str, str] | None = None) -> WorkerProcess:
    """A worker process for ``args``: through ``launcher`` when there is one."""
    return popen_worker(args, env) if launcher is None else launcher.spawn(args, env)


def _readable(fd: int, timeout_s: float | None) -> bool:
    """Whether ``fd`` becomes readable within ``timeout_s`` (None: wait for it).

    ``poll``, not ``select``: the daemon holds a socket per client connection, so its pidfds and
    the zygote's socket can be numbered past select's FD_SETSIZE (1024), where ``select`` raises
    "filedescriptor out of range" (a replay of social_media's peak, thousands of requests in
    flight, failed a generation's start that way)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else max(0, math.ceil(timeout_s * 1000.0))))


def _exited(pidfd: int) -> bool:
    """A pidfd is readable once its process has exited (reaped or not)."""
    return _readable(pidfd, 0)


class ForkedProcess:
    """A worker the zygote forked, with ``subprocess.Popen``'s surface."""

    started_by = "fork_server"

    def __init__(self, pid: int, pidfd: int, zygote: _Zygote, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = [sys.executable, "-m", WORKER_MODULE, *args]
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._zygote = zygote
        # the supervisor (the loop) and a retirement (a thread) may poll at once: the pidfd is
        # closed once, never while another thread signals through it
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None and self._pidfd >= 0 and _exited(self._pidfd):
                status = self._zygote.exit_status(self.pid, EXIT_REPORT_WAIT_S)
                self.returncode = UNKNOWN_STATUS if status is None else status
                os.close(self._pidfd)
                self._pidfd = -1
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            fd = self._pidfd
            if fd >= 0:
                with contextlib.suppress(OSError, ValueError):  # closed by another thread's poll
                    _readable(fd, left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Signal the process through its pidfd (never a recycled pid); nothing once it has exited."""
        if self.poll() is None:
            with self._lock, contextlib.suppress(ProcessLookupError):  # exited since: poll collects it
                if self._pidfd >= 0:
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1


class _Zygote:
    """One zygote process and the daemon's end of its socket (a new one after each restart)."""

    def __init__(self, preload: Sequence[str]) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        self.exits: dict[int, int] = {}  # pid -> status, as reported
        self.replies: dict[int, tuple[dict[str, object], list[int]]] = {}  # fork replies by id
        self.ready = False
        self.dead = False
        self._next_id = 0
        self._io = threading.Lock()  # one reader of the socket at a time (poll vs. a re-plan's thread)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jigsaw.runtime.forkserver", "--fd", str(theirs.fileno()),
                 *[a for m in preload for a in ("--preload", m)],
                 # PR_SET_PDEATHSIG fires when the *thread* that started it ends: only the main
                 # thread's start asks for it (a restart from a re-plan's thread relies on the
                 # socket's EOF and the daemon's pidfd, which the zygote watches too)
                 *([] if threading.current_thread() is threading.main_thread() else ["--no-pdeathsig"]),
                 "--room", " " * CMDLINE_ROOM],
                stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()

    def alive(self) -> bool:
        if not self.dead and self.proc.poll() is not None:
            self.dead = True
        return not self.dead

    def _handle(self, doc: dict[str, object], fds: list[int]) -> None:
        """Record one message: a child's exit status, the zygote's readiness, a fork's reply."""
        if "exit" in doc:
            self.exits[int(doc["exit"])] = int(doc["status"])  # type: ignore[call-overload]
        elif "ready" in doc:
            self.ready = True
        elif "id" in doc:
            self.replies[int(doc["id"])] = (doc, fds)  # type: ignore[call-overload]
            return
        for fd in fds:  # a descriptor nobody asked for
            os.close(fd)

    def _receive(self, timeout_s: float) -> tuple[dict[str, object], list[int]] | None:
        """One message within ``timeout_s`` (0: only one already there); None if none came.
        Marks the zygote dead when its socket closes (what it sent before is still read)."""
        if self.sock.fileno() < 0:
            return None
        if not _readable(self.sock.fileno(), timeout_s):
            return None
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            self.dead = True
            return None
        try:
            return json.loads(data), fds
        except ValueError:
            for fd in fds:
                os.close(fd)
            return None

    def drain(self, timeout_s: float = 0.0) -> None:
        """Read every message already sent (waiting up to ``timeout_s`` for the first)."""
        with self._io:
            while (got := self._receive(timeout_s)) is not None:
                self._handle(*got)
                timeout_s = 0.0

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready and self.alive() and time.monotonic() < deadline:
            self.drain(min(0.1, max(0.0, deadline - time.monotonic())))
        return self.ready

    def exit_status(self, pid: int, wait_s: float) -> int | None:
        deadline = time.monotonic() + wait_s
        while pid not in self.exits and time.monotonic() < deadline:
            if not self.alive():
                self.drain()  # what it reported before it died
                break
            self.drain(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.exits.pop(pid, None)

    def fork(self, args: Sequence[str], env: Mapping[str, str], cwd: str) -> ForkedProcess:
        """Ask for one child; raises OSError when the zygote cannot answer (then it is dead)."""
        self._next_id += 1
        ident = self._next_id
        request = json.dumps({"id": ident, "argv": list(args), "env": dict(env), "cwd": cwd}).encode()
        try:
            self.sock.sendall(request)
        except OSError:
            self.dead = True
            raise
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while ident not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                self.dead = True  # a zygote that does not answer is not trusted again
                raise OSError("the fork server did not answer")
            self.drain(min(0.05, left))
        reply, fds = self.replies.pop(ident)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the fork server could not fork: {reply['error']}")
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError("the fork server sent no pidfd")
        return ForkedProcess(int(reply["pid"]), fds[0], self, args)  # type: ignore[call-overload]

    def close(self) -> None:
        """Stop the zygote (its children live on: they watch the daemon, not it)."""
        with contextlib.suppress(OSError):
            self.sock.close()  # its end reads EOF and it exits
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dead = True


class ForkServer:
    """The daemon's side: a zygote, forks through it, ``subprocess.Popen`` while it is down.

    Thread-safe (a re-plan starts its processes from a thread). ``start`` waits for the first
    zygote's imports; a restarted one is used once it is ready, processes started meanwhile take
    the Popen path."""

    def __init__(self, preload: Sequence[str] = (WORKER_MODULE,), *,
                 log: Callable[[str], None] | None = None) -> None:
        self.preload = list(dict.fromkeys([WORKER_MODULE, *preload]))
        self._log = log
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self.forks_total = 0
        self.fallbacks_total = 0
        self.restarts_total = 0
        self.closed = False

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Start the zygote and wait until its imports are done; False if it did not get ready."""
        with self._lock:
            self._zygote = _Zygote(self.preload)
            zygote = self._zygote
        return zygote.wait_ready(timeout_s)

    @property
    def pid(self) -> int | None:
        z = self._zygote
        return z.proc.pid if z is not None and z.alive() else None

    def up(self) -> bool:
        """The zygote runs and has done its imports."""
        with self._lock:
            z = self._zygote
            if z is None or not z.alive():
                return False
            if not z.ready:
                z.drain()
            return z.ready

    def spawn(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> WorkerProcess:
        """A worker process for ``args`` (``python -m jigsaw.runtime.worker`` arguments) in
        ``env`` (None: this process's environment now): forked when the zygote is up, else
        started with ``subprocess.Popen`` (and a dead zygote started again)."""
        with self._lock:
            z = self._zygote
            if z is not None and not self.closed:
                if z.alive() and not z.ready:
                    z.drain()
                if z.alive() and z.ready:
                    try:
                        child = z.fork(args, os.environ if env is None else env, os.getcwd())
                        self.forks_total += 1
                        return child
                    except OSError as exc:
                        self._say(f"fork server: {exc}; starting the process with Popen")
                if not z.alive():
                    self._restart(z)
            self.fallbacks_total += 1
        return popen_worker(args, env)

    def _restart(self, dead: _Zygote) -> None:
        status = dead.proc.poll()
        dead.close()
        self.restarts_total += 1
        self._say(f"fork server (pid {dead.proc.pid}) died (status {status}); starting a new one")
        try:
            self._zygote = _Zygote(self.preload)
        except OSError as exc:
            self._say(f"fork server could not be started again: {exc}")
            self._zygote = None

    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)

    def prometheus(self) -> str:
        rows = [
            ("jigsaw_fork_server_enabled", "gauge",
             "1: worker processes are forked from the fork server ([server] fork_server)", 1),
            ("jigsaw_fork_server_up", "gauge", "1: the fork server runs and has done its imports",
             int(self.up())),
            ("jigsaw_fork_server_forks_total", "counter", "worker processes forked by the fork server",
             self.forks_total),
            ("jigsaw_fork_server_fallbacks_total", "counter",
             "worker processes started with a Python start instead (the fork server was down)",
             self.fallbacks_total),
            ("jigsaw_fork_server_restarts_total", "counter", "fork servers started again after dying",
             self.restarts_total),
        ]
        return "".join(f"# HELP {n} {h}\n# TYPE {n} {t}\n{n} {v}\n" for n, t, h, v in rows)

    def status(self) -> dict[str, object]:
        """What ``/admin/workers`` shows of it."""
        return {"enabled": True, "up": self.up(), "pid": self.pid, "forks_total": self.forks_total,
                "fallbacks_total": self.fallbacks_total, "restarts_total": self.restarts_total}

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


def prometheus(launcher: Launcher | None) -> str:
    """The fork server's ``/metrics`` rows; with none (``[server] fork_server = false``) only
    ``jigsaw_fork_server_enabled 0``."""
    if isinstance(launcher, ForkServer):
        return launcher.prometheus()
    name = "jigsaw_fork_server_enabled"
    return (f"# HELP {name} 1: worker processes are forked from the fork server ([server] fork_server)\n"
            f"# TYPE {name} gauge\n{name} 0\n")


def status(launcher: Launcher | None) -> dict[str, object]:
    """What ``/admin/workers`` shows of the fork server."""
    return launcher.status() if isinstance(launcher, ForkServer) else {"enabled": False}


def preload_modules(class_path: str, needs_gpu: bool) -> list[str]:
    """What the zygote imports: the worker and, for a backend that needs no GPU, its module (a
    GPU backend's libraries are imported by each child after the fork: importing one may
    initialise the device, which a forked child could not use)."""
    return [WORKER_MODULE] + ([] if needs_gpu else [class_path.partition(":")[0]])


# ---- the zygote's side ---------------------------------------------------------------------------
def _prctl(option: int, arg: int | ctypes.c_char_p) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg)


def _watch_daemon(pidfd: int) -> None:
    """SIGKILL this process when the daemon exits (a thread blocked on the daemon's pidfd;
    every signal blocked in it, so the process's signals go to its main thread)."""
    def watch() -> None:
        _readable(pidfd, None)
        os.kill(os.getpid(), signal.SIGKILL)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        threading.Thread(target=watch, name="daemon-watch", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def set_cmdline(args: Sequence[str]) -> bool:
    """Make ``/proc/self/cmdline`` (what ``ps`` shows) read ``args``: written over the
    process's own argument strings (``arg_start``..``arg_end`` of /proc/self/stat) through
    /proc/self/mem, padded with NULs; False when they do not fit or the kernel refuses."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
        data = b"\0".join(os.fsencode(a) for a in args) + b"\0"
        if len(data) > end - start:
            return False
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data.ljust(end - start, b"\0"))
        return True
    except (OSError, ValueError, IndexError):
        return False


def _child(request: dict[str, object], sock: socket.socket, daemon_pidfd: int, comm: bytes) -> None:
    """In the forked child: a clean process, then the worker's ``main``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        sock.detach()
        keep = sorted({0, 1, 2, daemon_pidfd})
        for lo, hi in zip([k + 1 for k in keep], [*keep[1:], os.sysconf("SC_OPEN_MAX")]):
            if lo < hi:
                os.closerange(lo, hi)
        _prctl(15, ctypes.c_char_p(comm[:15]))  # PR_SET_NAME: the worker's name, not the zygote's
        os.chdir(str(request["cwd"]))
        env = {str(k): str(v) for k, v in dict(request["env"]).items()}  # type: ignore[call-overload]
        os.environ.clear()
        os.environ.update(env)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # the global generator; ``random`` reseeds at fork
        _watch_daemon(daemon_pidfd)
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = [WORKER_MODULE, *argv]
        set_cmdline([sys.executable, "-m", WORKER_MODULE, *argv])  # ps shows a worker, not the zygote
        from jigsaw.runtime.worker import main
        code = main(argv, watch_parent=False)
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(fd: int, preload: Sequence[str], *, pdeathsig: bool = True) -> int:
    """The zygote: import ``preload``, then fork a worker per request until the daemon goes (its
    end of the socket closes, or its pidfd says it exited)."""
    daemon = os.getppid()
    if pdeathsig:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the daemon
    try:
        daemon_pidfd = os.pidfd_open(daemon)
    except ProcessLookupError:
        return 0
    if os.getppid() != daemon:
        return 0
    try:
        comm = open("/proc/self/comm", "rb").read().strip()  # noqa: SIM115
    except OSError:
        comm = b"python"
    sock = socket.socket(fileno=fd)
    for name in preload:
        importlib.import_module(name)
    _prctl(15, ctypes.c_char_p(ZYGOTE_NAME))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon handles ^C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def send(doc: dict[str, object], fds: Sequence[int] = ()) -> None:
        with contextlib.suppress(OSError):  # the daemon is gone: the loop sees EOF
            socket.send_fds(sock, [json.dumps(doc).encode()], list(fds))

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send({"exit": pid, "status": os.waitstatus_to_exitcode(status)})

    send({"ready": os.getpid()})
    poller = select.poll()  # not select: the daemon may hand over descriptors past FD_SETSIZE
    for fd in (sock.fileno(), wake_r, daemon_pidfd):
        poller.register(fd, select.POLLIN)
    while True:
        readable = {fd for fd, _ in poller.poll()}
        if daemon_pidfd in readable:
            return 0  # the daemon exited (its children watch it themselves)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            reap()
        if sock.fileno() not in readable:
            continue
        try:
            data = sock.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            return 0  # the daemon closed its end (or died)
        try:
            request = json.loads(data)
            ident = request["id"]
        except (ValueError, KeyError, TypeError):
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            send({"id": ident, "error": str(exc)})
            continue
        if pid == 0:
            _child(request, sock, daemon_pidfd, comm)
        pidfd = os.pidfd_open(pid)  # before any reap: the pid is still this child's
        send({"id": ident, "pid": pid}, [pidfd])
        os.close(pidfd)
        reap()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jigsaw-forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the daemon's socket (inherited)")
    parser.add_argument("--preload", action="append", default=[], help="a module to import before forking")
    parser.add_argument("--room", default="", help="room its children's command lines are written in")
    parser.add_argument("--no-pdeathsig", action="store_true",
                        help="do not ask the kernel to kill it with its parent's starting thread")
    args = parser.parse_args(argv)
    return serve(args.fd, args.preload, pdeathsig=not args.no_pdeathsig)


if __name__ == "__main__":
    sys.exit(main())
