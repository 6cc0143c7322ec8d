"""No lost wake-ups: many producer and consumer processes, randomized sleeps, one doorbell each.

Each consumer runs a uvloop loop that watches its doorbell's FIFO (``add_reader``) and follows the
arm / re-check protocol of ``rings.Doorbell``; each producer pushes to one ring per consumer and
rings after every push, sleeping a random while (often none) in between. A consumer's only other
wake-up is a long safety timer; a timer that fires while records wait in its rings is a lost
wake-up, and the test fails on it. Bounded: every process gives up after 60 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

_CONSUMER = textwrap.dedent("""
    import asyncio, sys, time
    import uvloop
    from jigsaw.runtime.rings import Doorbell, ShmRing
    bell_name, expect, *ring_names = sys.argv[1:]
    expect = int(expect)
    bell = Doorbell.attach(bell_name)
    rings = [ShmRing.attach(n, role="consumer") for n in ring_names]
    SAFETY_S = 2.0

    async def main():
        loop = asyncio.get_running_loop()
        got, lost, wakes = 0, 0, 0
        nxt = [1] * len(rings)
        waiter = []
        def wake():
            if waiter and not waiter[0].done():
                waiter[0].set_result(None)
        def on_bell():
            bell.clear()
            wake()
        timed_out = []
        def on_timer():
            timed_out.append(True)
            wake()
        loop.add_reader(bell.fileno(), on_bell)
        give_up = time.monotonic() + 60
        while got < expect and time.monotonic() < give_up:
            bell.disarm()
            for k, ring in enumerate(rings):
                for h, _ in ring.pop_many(1000):
                    assert h.request_id == nxt[k], (k, h.request_id, nxt[k])
                    nxt[k] += 1
                    got += 1
            if got >= expect:
                break
            bell.arm()
            if any(len(r) for r in rings):
                continue
            fut = loop.create_future()
            waiter[:] = [fut]
            timed_out.clear()
            timer = loop.call_later(SAFETY_S, on_timer)
            await fut
            timer.cancel()
            if not timed_out:
                wakes += 1
            elif any(len(r) for r in rings):
                lost += 1  # the safety timer found records no ring had woken us for
        print(got, lost, wakes, flush=True)

    uvloop.run(main())
""")

_PRODUCER = textwrap.dedent("""
    import random, sys, time
    from jigsaw.runtime.rings import Doorbell, RecordHeader, ShmRing
    seed, n, *pairs = sys.argv[1:]
    rng = random.Random(int(seed))
    outs = [(ShmRing.attach(pairs[i], role="producer"), Doorbell.attach(pairs[i + 1]))
            for i in range(0, len(pairs), 2)]
    give_up = time.monotonic() + 60
    for i in range(1, int(n) + 1):
        for ring, bell in outs:
            while not ring.push(RecordHeader(request_id=i), b"x" * rng.randrange(64)):
                bell.ring()
                time.sleep(0.0001)
                if time.monotonic() > give_up:
                    sys.exit("consumer stalled")
            bell.ring()
        r = rng.random()
        if r < 0.3:
            time.sleep(rng.random() * 0.002)
        elif r < 0.5:
            time.sleep(0)
""")


@pytest.mark.parametrize("impl_name", ["compiled", "pure"])
def test_no_lost_wakeups_many_producers_and_consumers(impl_name, registry):
    from jigsaw.runtime.rings import load_core
    if impl_name == "compiled" and load_core() is None:
        pytest.skip("jigsaw._core is not built or JIGSAW_NO_EXTENSIONS=1")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JIGSAW_NO_EXTENSIONS="1" if impl_name == "pure" else "0")
    consumers, producers, n = 3, 3, 400
    bells = [registry.create_doorbell(f"w{c}") for c in range(consumers)]
    rings = {(p, c): registry.create_ring(f"r{p}-{c}", 1 << 14) for p in range(producers)
             for c in range(consumers)}
    procs: list[subprocess.Popen[str]] = []
    try:
        for c in range(consumers):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _CONSUMER, bells[c].name, str(producers * n),
                 *(rings[p, c].name for p in range(producers))], env=env, stdout=subprocess.PIPE, text=True))
        time.sleep(0.3)  # let the consumers reach their first sleep
        for p in range(producers):
            pairs = [x for c in range(consumers) for x in (rings[p, c].name, bells[c].name)]
            procs.append(subprocess.Popen([sys.executable, "-c", _PRODUCER, str(p), str(n), *pairs],
                                          env=env, stdout=subprocess.PIPE, text=True))
        for proc in procs[consumers:]:
            assert proc.wait(timeout=90) == 0
        for proc in procs[:consumers]:
            out, _ = proc.communicate(timeout=90)
            got, lost, wakes = map(int, out.split())
            assert got == producers * n, f"a consumer received {got} of {producers * n} records"
            assert lost == 0, f"{lost} wake-ups were lost (records found only by the safety timer)"
            assert wakes > 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for obj in (*bells, *rings.values()):
            obj.close()


_IDLE = textwrap.dedent("""
    import asyncio, sys, time
    import uvloop
    from jigsaw.runtime.rings import Doorbell
    bell = Doorbell.attach(sys.argv[1])

    async def main():
        loop = asyncio.get_running_loop()
        woke = asyncio.Event()
        loop.add_reader(bell.fileno(), lambda: (bell.clear(), woke.set()))
        print("ready", flush=True)
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.wait_for(woke.wait(), 20)
        print(time.process_time() - cpu0, time.monotonic() - t0, flush=True)

    uvloop.run(main())
""")


def test_loop_sleeping_on_its_bell_uses_no_cpu_and_wakes(registry):
    bell = registry.create_doorbell("idle-loop")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", _IDLE, bell.name], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        bell.ring()
        out, _ = proc.communicate(timeout=20)
        cpu_s, wall_s = map(float, out.split())
        assert 0.4 <= wall_s < 10, "the ring did not wake the loop"
        assert cpu_s < 0.05, f"a loop sleeping on its doorbell used {cpu_s} s CPU"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bell.close()
