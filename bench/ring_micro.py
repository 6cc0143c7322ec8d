"""Micro-benchmark of the shared-memory ring: compiled vs pure Python, measured in one run.

    PYTHONPATH=src python bench/ring_micro.py [--seconds 0.5] [--samples 2000] [--latency-only]
        [--placements free,same,apart] [--modes spin,semaphore,raw,raw-loop,doorbell,loop]
        [--sizes '64 B,16 KiB'] [--repeats 1]

* throughput: push+pop of one record in one process (records/s); and the data plane's framed
  calls (``push_framed`` + ``pop_many_framed``: the credit and the tensors, one copy each way);
* the frontend's read of completion records: ``pop_completions`` (flat tuples) against
  ``pop_many_framed`` and the header objects' fields (records/s);
* one-way latency: a child process stamps ``created_ns`` and pushes; this process pops and
  subtracts (ping-pong over a second ring, so no queue builds up). ``spin``: the consumer polls
  ``pop``; ``doorbell``: it sleeps in ``Doorbell.wait`` (poll() on the doorbell's FIFO) and the
  producer rings; ``loop``: it sleeps in a uvloop loop that watches the FIFO (``add_reader``,
  the arm / re-check handshake of the workers and the frontend). In the two sleeping modes the
  producer pauses 0.3 ms before each record, so the consumer is asleep when it arrives: the
  figure includes the wake-up (and yields while it waits for the ack: a spinning producer would
  keep a consumer on its CPU waiting). ``--placements``: the sleeping modes with producer and
  consumer left to the scheduler (``free``), pinned to one CPU (``same``) or to two (``apart``).
  Both sleeping modes run with each kind of doorbell (``fifo``, and
  ``eventfd`` where this machine lets a child take its parent's descriptor). ``floor``: the
  host's wake-up alone, per placement: the producer writes its send time to a bare eventfd (no
  ring, no flag) and the consumer sleeps in a blocking ``read`` (the floor of ``doorbell``) or in
  a uvloop loop watching it (the floor of ``loop``); a sleeping mode's p50 minus its floor is what
  the project's code adds (the ring, the flag's handshake, the drain). The ``raw`` floor also
  times the producer's own ``write`` that wakes the sleeper: what a wake-up costs the process
  that rings (on a VM whose idle CPUs halt, an interprocessor interrupt through the hypervisor),
  the reason a wake-up rung ahead of time (before a batch) does not pay. ``semaphore``: the
  earlier design's wake-up for reference, the consumer blocked in ``sem_timedwait`` on a POSIX
  semaphore (the producer posts).

Absolute numbers depend on the machine; compare the ratio column.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import posix_ipc
import uvloop

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from jigsaw.runtime import _pyring  # noqa: E402
from jigsaw.runtime.rings import (  # noqa: E402
    BELL_EVENTFD,
    BELL_FIFO,
    Doorbell,
    SegmentRegistry,
    _probe_eventfd_sharing,
    load_core,
)

SIZES = {"64 B": 64, "16 KiB": 16384}

_PRODUCER = textwrap.dedent("""
    import sys, time
    import os
    impl, ping_name, pong_name, bell_name, n, size, mode, cpu = sys.argv[1:9]
    n, size = int(n), int(size)
    if cpu != "-":
        os.sched_setaffinity(0, {int(cpu)})
    if impl == "compiled":
        from jigsaw._core import RecordHeader, ShmRing
    else:
        from jigsaw.runtime._pyring import RecordHeader, ShmRing
    from jigsaw.runtime.rings import Doorbell
    import posix_ipc
    ping, pong = ShmRing.attach(ping_name, role="producer"), ShmRing.attach(pong_name, role="consumer")
    raw = mode.startswith("raw")  # the wake-up floor: the send time written to a bare eventfd
    if raw:
        fd = int(bell_name)
    else:
        bell = Doorbell.attach(bell_name) if mode != "semaphore" else posix_ipc.Semaphore(bell_name)
        ring = bell.release if mode == "semaphore" else bell.ring
    payload = bytes(size)
    write_ns = []
    give_up = time.monotonic() + 120
    for i in range(n):
        if mode != "spin":
            time.sleep(0.0003)  # let the consumer fall asleep
        if raw:
            sent = time.monotonic_ns()
            os.write(fd, sent.to_bytes(8, "little"))
            write_ns.append(time.monotonic_ns() - sent)  # what waking the sleeper costs this process
        else:
            h = RecordHeader(request_id=i)
            h.created_ns = time.monotonic_ns()
            ping.push(h, payload)
            if mode != "spin":
                ring()
        while pong.pop() is None:  # (sleeping modes: yield, the consumer may share this CPU)
            if mode != "spin":
                os.sched_yield()
            if time.monotonic() > give_up:
                sys.exit("consumer stalled")
    ping.close(); pong.close()
    print(" ".join(map(str, write_ns)))
""")


class _Semaphore:
    """The earlier doorbell: a named POSIX semaphore (for the ``semaphore`` rows)."""

    def __init__(self, name: str) -> None:
        self.sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=0)
        self.name = name

    def wait(self, timeout_s: float) -> None:
        self.sem.acquire(timeout_s)

    def close(self) -> None:
        self.sem.close()


def _impls() -> dict[str, object]:
    core = load_core()
    impls: dict[str, object] = {}
    if core is not None:
        impls["compiled"] = core
    impls["pure"] = _pyring
    return impls


def throughput_rps(mod, reg: SegmentRegistry, tag: str, size: int, seconds: float,
                   framed: bool = False) -> float:
    """push + pop of one record; ``framed``: the data plane's way, ``push_framed`` (credit + tensors
    written into the ring, no joined payload) and ``pop_many_framed`` (credit and tensors out)."""
    name = reg.name(f"tp-{tag}{'-framed' if framed else ''}")
    reg.add_shm(name)
    ring = mod.ShmRing.create(name, 1 << 22)
    header = mod.RecordHeader(request_id=1, deadline_ns=2)
    payload = bytes(size)
    burst = 256
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            if framed:
                for _ in range(burst):
                    ring.push_framed(header, 12345, payload)
                for _ in range(burst):
                    ring.pop_many_framed(1)
            else:
                for _ in range(burst):
                    ring.push(header, payload)
                for _ in range(burst):
                    ring.pop()
            n += burst
        return n / (time.perf_counter() - t0)
    finally:
        ring.close()


def completion_read_rps(mod, reg: SegmentRegistry, tag: str, seconds: float, flat: bool) -> float:
    """The frontend's read of completion records, three per pop (a chain's records), 64-byte
    tensors: ``flat`` ``pop_completions`` (one tuple per record, durations computed in the core),
    else ``pop_many_framed`` and the fields and durations read from each header object (the
    frontend's read before ``pop_completions``). Records read per second; the push is not timed."""
    name = reg.name(f"cr-{tag}")
    reg.add_shm(name)
    ring = mod.ShmRing.create(name, 1 << 22)
    header = mod.RecordHeader(request_id=1, task=2, child_count=1,
                              hops=(1_000, 4_000, 10_000, 12_500, 13_000, 1))
    payload = bytes(64)
    burst = 255
    n = 0
    spent = 0.0
    try:
        while spent < seconds:
            for _ in range(burst):
                ring.push_framed(header, 12345, payload)
            t0 = time.perf_counter()
            if flat:
                for _ in range(burst // 3):
                    for rec in ring.pop_completions(3):
                        (_, _, _, _, _, _, _, _, _, _, _, _) = rec
            else:
                for _ in range(burst // 3):
                    for h, _credit, _tensors in ring.pop_many_framed(3):
                        hops = h.hops
                        (h.request_id, h.task, h.status, h.child_index, h.child_count,
                         max(0.0, (hops[2] - hops[0]) / 1e3), max(0.0, (hops[3] - hops[2]) / 1e3), hops[5],
                         max(0.0, (hops[1] - hops[0]) / 1e3), hops[4])
            spent += time.perf_counter() - t0
            n += burst
        return n / spent
    finally:
        ring.close()


PLACEMENTS = ("free", "same", "apart")
MODES = ("spin", "semaphore", "raw", "raw-loop", "doorbell", "loop")


def _cpus_of(placement: str) -> tuple[int | None, int | None]:
    """(consumer CPU, producer CPU) of a placement: ``free`` leaves both to the scheduler, ``same``
    pins both to one CPU, ``apart`` to two different ones (None: not pinned)."""
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "free" or (placement == "apart" and len(cpus) < 2):
        return None, None
    if placement == "same":
        return cpus[0], cpus[0]
    return cpus[0], cpus[1]


def _cpus_title(placement: str) -> str:
    return "" if placement == "free" else f", cpus {placement}"


def latency_us(impl_name: str, mod, reg: SegmentRegistry, tag: str, size: int, samples: int,
               mode: str, bell_kind: int = BELL_FIFO, placement: str = "free"
               ) -> tuple[float, float, float, float]:
    """One-way latency p50 and p99 (us) of ``mode``; for ``raw``, also the p50 and p99 of the
    producer's own eventfd write that wakes the sleeping consumer (else NaN)."""
    ping_name, pong_name = reg.name(f"ping-{tag}"), reg.name(f"pong-{tag}")
    reg.add_shm(ping_name)
    reg.add_shm(pong_name)
    ping = mod.ShmRing.create(ping_name, 1 << 20, role="consumer")
    pong = mod.ShmRing.create(pong_name, 1 << 16, role="producer")
    raw_fd = -1
    if mode.startswith("raw"):  # a bare eventfd the producer inherits (blocking for ``raw``)
        raw_fd = os.eventfd(0, os.EFD_NONBLOCK if mode == "raw-loop" else 0)
        bell = None
        cleanup = lambda: os.close(raw_fd)  # noqa: E731
    elif mode == "semaphore":
        reg.add_bell(reg.name(f"sem-{tag}"))  # unlinks a semaphore of that name too
        bell = _Semaphore(reg.name(f"sem-{tag}"))
        cleanup = bell.close
    else:
        reg.add_bell(reg.name(f"bell-{tag}"))
        bell = Doorbell.create(reg.name(f"bell-{tag}"), bell_kind)
        cleanup = bell.close
    env = dict(os.environ, PYTHONPATH=str(SRC), JIGSAW_NO_EXTENSIONS="1" if impl_name == "pure" else "0")
    consumer_cpu, producer_cpu = _cpus_of(placement)
    pin = "-" if producer_cpu is None else str(producer_cpu)
    bell_arg = str(raw_fd) if bell is None else bell.name
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, impl_name, ping_name, pong_name, bell_arg,
                             str(samples), str(size), mode, pin], env=env,
                            pass_fds=(raw_fd,) if raw_fd >= 0 else (), stdout=subprocess.PIPE, text=True)
    allowed = os.sched_getaffinity(0)
    if consumer_cpu is not None:
        os.sched_setaffinity(0, {consumer_cpu})
    lat_ns: list[int] = []
    ack = mod.RecordHeader()
    give_up = time.monotonic() + 120
    try:
        if mode == "loop":
            uvloop.run(_loop_consumer(ping, pong, bell, ack, lat_ns, samples, give_up))
        elif mode == "raw-loop":
            uvloop.run(_raw_loop_consumer(raw_fd, pong, ack, lat_ns, samples, give_up))
        while mode == "raw" and len(lat_ns) < samples and time.monotonic() < give_up:
            sent_ns = int.from_bytes(os.read(raw_fd, 8), "little")  # (blocks: the wake-up alone)
            lat_ns.append(time.monotonic_ns() - sent_ns)
            pong.push(ack, b"")
        while not mode.startswith("raw") and len(lat_ns) < samples and time.monotonic() < give_up:
            rec = ping.pop()
            if rec is None:
                if mode in ("doorbell", "semaphore"):
                    with contextlib.suppress(posix_ipc.BusyError):
                        bell.wait(1.0)
                continue
            lat_ns.append(time.monotonic_ns() - rec[0].created_ns)
            pong.push(ack, b"")
        written, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ping.close()
        pong.close()
        cleanup()
        os.sched_setaffinity(0, allowed)
    if len(lat_ns) < samples:
        raise RuntimeError(f"only {len(lat_ns)} of {samples} latency samples arrived")
    return (*_p50_p99_us(lat_ns), *_p50_p99_us([int(x) for x in written.split()]))


def _p50_p99_us(values_ns: list[int]) -> tuple[float, float]:
    """p50 and p99 in us, the first 5% of the samples left out (warm-up); NaN when there are none."""
    if not values_ns:
        return float("nan"), float("nan")
    values_ns = sorted(values_ns)
    warm = values_ns[len(values_ns) // 20:] if len(values_ns) > 100 else values_ns
    return warm[len(warm) // 2] / 1e3, warm[int(len(warm) * 0.99)] / 1e3


async def _loop_consumer(ping, pong, bell, ack, lat_ns: list[int], samples: int, give_up: float) -> None:
    """The data plane's consumer: a loop watching the doorbell FIFO, draining every record per wake-up."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    rung = False

    def drain() -> None:
        nonlocal rung
        while True:
            for h, _ in ping.pop_many(64):
                lat_ns.append(time.monotonic_ns() - h.created_ns)
                pong.push(ack, b"")
            if len(lat_ns) >= samples or time.monotonic() > give_up:
                if not done.done():
                    done.set_result(None)
                return
            if rung:  # the wake-up is read after the work, before the arm, as the workers do
                rung = False
                bell.clear()
            bell.arm()
            if not len(ping):
                return
            bell.disarm()

    def on_bell() -> None:
        nonlocal rung
        rung = True
        drain()

    loop.add_reader(bell.fileno(), on_bell)
    try:
        drain()
        await asyncio.wait_for(done, max(0.0, give_up - time.monotonic()))
    finally:
        loop.remove_reader(bell.fileno())


async def _raw_loop_consumer(fd: int, pong, ack, lat_ns: list[int], samples: int, give_up: float) -> None:
    """The floor of the ``loop`` mode: the same loop watching a bare eventfd that carries the send
    time (no ring, no flag): what uvloop adds to the host's wake-up."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def on_readable() -> None:
        with contextlib.suppress(BlockingIOError):
            sent_ns = int.from_bytes(os.read(fd, 8), "little")
            lat_ns.append(time.monotonic_ns() - sent_ns)
            pong.push(ack, b"")
        if (len(lat_ns) >= samples or time.monotonic() > give_up) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(done, max(0.0, give_up - time.monotonic()))
    finally:
        loop.remove_reader(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=0.5, help="duration of each throughput run")
    ap.add_argument("--samples", type=int, default=2000, help="latency samples per configuration")
    ap.add_argument("--latency-only", action="store_true", help="skip the throughput rows")
    ap.add_argument("--placements", default=",".join(PLACEMENTS),
                    help="CPU placements of the sleeping modes' producer and consumer: free (the "
                         "scheduler's), same (both pinned to one CPU), apart (two CPUs)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="latency modes to run (default all): " + ", ".join(MODES))
    ap.add_argument("--sizes", default=",".join(SIZES), help="payloads of the ring modes (default all)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every latency configuration this often, the configurations in turn (so a "
                         "change of load hits them alike), and print the median of the runs' p50 and p99")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if bad := [m for m in args.modes if m not in MODES]:
        ap.error(f"--modes: unknown {bad}; expected some of {', '.join(MODES)}")
    args.sizes = [x for x in args.sizes.split(",") if x]
    if bad := [x for x in args.sizes if x not in SIZES]:
        ap.error(f"--sizes: unknown {bad}; expected some of {', '.join(SIZES)}")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    args.placements = [p for p in args.placements.split(",") if p]
    if bad := [p for p in args.placements if p not in PLACEMENTS]:
        ap.error(f"--placements: unknown {bad}; expected some of {', '.join(PLACEMENTS)}")
    kinds = {"fifo": BELL_FIFO}
    if _probe_eventfd_sharing():
        kinds["eventfd"] = BELL_EVENTFD
    impls = _impls()
    if "compiled" not in impls:
        print("note: jigsaw._core is not built or disabled; showing the pure ring only", file=sys.stderr)
    rows: list[tuple[str, str, dict[str, float]]] = []
    with SegmentRegistry(None) as reg:
        for label, size in ({} if args.latency_only else SIZES).items():
            cells = {k: throughput_rps(m, reg, f"{k}-{size}", size, args.seconds) for k, m in impls.items()}
            rows.append(("push+pop throughput (records/s)", label, cells))
            cells = {k: throughput_rps(m, reg, f"{k}-{size}", size, args.seconds, framed=True)
                     for k, m in impls.items()}
            rows.append(("push_framed+pop_many_framed (records/s)", label, cells))
        for flat, metric in () if args.latency_only else ((False, "completion read: framed + header"),
                                                          (True, "completion read: pop_completions")):
            cells = {k: completion_read_rps(m, reg, f"{k}-{flat}", args.seconds, flat)
                     for k, m in impls.items()}
            rows.append((f"{metric} (rec/s)", "64 B", cells))
        modes = [(m, BELL_FIFO, m, "free") for m in ("spin", "semaphore") if m in args.modes]
        floors = (("raw", "floor: bare eventfd, blocking read"), ("raw-loop", "floor: bare eventfd, loop"))
        modes += [(mode, BELL_EVENTFD, title + _cpus_title(where), where) for mode, title in floors
                  if mode in args.modes and "eventfd" in kinds for where in args.placements]
        modes += [(mode, kind, f"{mode}/{kind_name}" + _cpus_title(where), where)
                  for mode in ("doorbell", "loop") if mode in args.modes for kind_name, kind in kinds.items()
                  for where in args.placements]
        configs = [(mode, kind, title, where, label, size) for mode, kind, title, where in modes
                   for label, size in ({"8 B": 8} if mode.startswith("raw") else
                                       {x: SIZES[x] for x in args.sizes}).items()]
        runs: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for r in range(args.repeats):
            for i, (mode, kind, _, where, _, size) in enumerate(configs):
                for k, m in impls.items():
                    tag = f"{k}-{size}-{mode}-{kind}-{where}-{r}"
                    runs.setdefault((i, k), []).append(
                        latency_us(k, m, reg, tag, size, args.samples, mode, kind, where))
        for i, (mode, _, title, where, label, _) in enumerate(configs):
            for q, name in ((0, "p50"), (1, "p99")):
                cells = {k: statistics.median(r[q] for r in runs[(i, k)]) for k in impls}
                rows.append((f"one-way latency {name} (us), {title}", label, cells))
            for q, name in ((2, "p50"), (3, "p99")) if mode == "raw" else ():
                cells = {k: statistics.median(r[q] for r in runs[(i, k)]) for k in impls}
                metric = f"the waking write's cost to the producer {name} (us){_cpus_title(where)}"
                rows.append((metric, label, cells))
    names = list(impls)
    header = f"{'metric':<62} {'payload':>8} " + " ".join(f"{n:>12}" for n in names)
    if len(names) == 2:
        header += f" {'compiled/pure':>14}"
    print(header)
    print("-" * len(header))
    for metric, label, cells in rows:
        line = f"{metric:<62} {label:>8} " + " ".join(f"{cells[n]:>12,.1f}" for n in names)
        if len(names) == 2:
            line += f" {cells['compiled'] / cells['pure']:>14.2f}"
        print(line)
    print(f"\nhost: {os.cpu_count()} CPUs; latency excludes the first 5% of samples (warm-up)"
          + (f"; median of {args.repeats} runs per configuration." if args.repeats > 1 else "."))


if __name__ == "__main__":
    main()
