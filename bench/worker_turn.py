"""A worker's per-record CPU: one turn for one item, in this process, without wake-ups.

    PYTHONPATH=src python bench/worker_turn.py [--items 20000] [--sink] [--stages]

Builds a middle task's worker (``runtime/worker.py`` ``Worker``, the emulated backend, ~0 ms
task, one child per item; ``--sink``: no child) on real shared-memory rings, then per item: push
one item into its input ring as the frontend would, run the worker's turn (``Worker._turn``: pop,
batch, run, completion record, child record, doorbells, arm), and empty its output rings. The
consumers' doorbell flags are left awake, so no turn makes a wake-up system call: the figure is
the Python and core work of one hop, the part of a hop's latency that is the worker's own (the
rest is the wake-up, ``bench/ring_micro.py``). Blocks of 1000 items; prints the minimum and the
median block (us per item; other work on the machine raises the median, rarely the minimum).
Runs the compiled core, or the pure fallbacks with ``JIGSAW_NO_EXTENSIONS=1``.

``--stages`` also keeps every item's timeline (the worker's ``JIGSAW_HOP_TRACE`` rows; the
turn's start stands for the doorbell's wake-up) and prints the median of each step, the
in-process counterpart of ``bench/dataplane.py`` part [2b]'s worker rows: what the worker's own
code costs at each step when nothing else runs, against what the same step costs in a live hop.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from jigsaw.runtime import worker as worker_module
from jigsaw.runtime.records import HOP_SENT, TOTAL_CREDIT
from jigsaw.runtime.rings import HAS_EXTENSION, RecordHeader, SegmentRegistry, ShmRing
from jigsaw.runtime.stats import StatsBlock
from jigsaw.runtime.topology import OutputRing, ProcessSpec

BLOCK = 1000
PAYLOAD = bytes(64)


def _spec(reg: SegmentRegistry, sink: bool) -> tuple[ProcessSpec, dict[str, object]]:
    segs: dict[str, object] = {
        "in": reg.create_ring("in", 1 << 20), "out": reg.create_ring("out", 1 << 20),
        "done": reg.create_ring("done", 1 << 20), "own": reg.create_doorbell("own"),
        "out_bell": reg.create_doorbell("out-bell"), "done_bell": reg.create_doorbell("done-bell"),
    }
    stats = reg.name("stats")
    reg.add_shm(stats)
    segs["stats"] = StatsBlock.create(stats, 4)
    fast = {1: 0.001, 2: 0.001, 4: 0.001}
    spec = ProcessSpec(
        slot=0, name="bench.b.v.1g.0", app="bench", app_index=0, task="b", task_index=1, task_kind="generic",
        variant="v", mig_profile="1g.10gb", mps=1, max_batch=4, latency_ms_by_batch=fast, time_scale=1.0,
        max_wait_ns=10**9, staleness_ns=5 * 10**9, remaining_min_ns=0, exec_estimate_ns=[1000] * 4,
        downstream=[] if sink else [{"task": "c", "task_index": 2, "factor": 1.0}],
        doorbell=segs["own"].name, inputs=[segs["in"].name],  # type: ignore[attr-defined]
        outputs=[] if sink else [OutputRing(segs["out"].name, segs["out_bell"].name, 1, "c")],  # type: ignore[attr-defined]
        routes=[{} if sink else {"c": [0]}], completion_ring=segs["done"].name,  # type: ignore[attr-defined]
        completion_doorbell=segs["done_bell"].name, stats=stats,  # type: ignore[attr-defined]
        mean_ms_by_batch={b: 0.8 * ms for b, ms in fast.items()})
    return spec, segs


STAGES = (("woken -> item popped", 3, 4), ("popped -> batch starts (batch formation)", 4, 5),
          ("batch runs (emulated ~0 ms)", 5, 6), ("batch done -> completion record pushed", 6, 7),
          ("completion pushed -> child pushed", 7, 8), ("child pushed -> doorbell written", 8, 9),
          ("woken -> doorbell written", 3, 9))


async def _measure(w: worker_module.Worker, segs: dict[str, object], n: int) -> list[float]:
    loop = asyncio.get_running_loop()
    w._done = loop.create_future()
    w._loop = loop
    producer = ShmRing.attach(segs["in"].name, role="producer")  # type: ignore[attr-defined]
    outputs = [ShmRing.attach(segs[k].name, role="consumer") for k in ("out", "done")]  # type: ignore[attr-defined]
    for k in ("out_bell", "done_bell"):
        segs[k].disarm()  # type: ignore[attr-defined]  # awake consumers: no wake-up system calls
    blocks, spent = [], 0
    try:
        for i in range(n):
            now = time.monotonic_ns()
            h = RecordHeader(request_id=i, deadline_ns=now + 10**10, created_ns=now)
            h.stamp(HOP_SENT, now)
            producer.push_framed(h, TOTAL_CREDIT, PAYLOAD)
            t0 = time.perf_counter_ns()
            w._woke_ns = time.monotonic_ns()  # (as the doorbell's callback stamps it)
            w._turn()
            spent += time.perf_counter_ns() - t0
            for ring in outputs:
                ring.pop_many_framed(8)
            if i % BLOCK == BLOCK - 1:
                blocks.append(spent / BLOCK / 1e3)
                spent = 0
    finally:
        if w._timer is not None:
            w._timer.cancel()
        producer.close()
        for ring in outputs:
            ring.close()
    return blocks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=20000, help="items (blocks of 1000; the first is warm-up)")
    ap.add_argument("--sink", action="store_true", help="a sink task (no child record)")
    ap.add_argument("--stages", action="store_true",
                    help="keep every item's timeline and print the median of each step (us)")
    args = ap.parse_args()
    if args.items < 2 * BLOCK:
        ap.error(f"--items must be at least {2 * BLOCK}")
    with SegmentRegistry(None) as reg:
        spec, segs = _spec(reg, args.sink)
        w = worker_module.Worker(spec)
        if args.stages:
            w.trace = []
        try:
            blocks = sorted(uvloop.run(_measure(w, segs, args.items))[1:])
        finally:
            trace, w.trace = w.trace, None  # (kept here: ``close`` would write it to JIGSAW_HOP_TRACE)
            w.close()
            segs["stats"].close()  # type: ignore[attr-defined]
            for k in ("in", "out", "done", "own", "out_bell", "done_bell"):
                segs[k].close()  # type: ignore[attr-defined]
    impl = "compiled core" if HAS_EXTENSION else "pure fallbacks"
    print(f"worker turn, one item ({'sink' if args.sink else 'one child'}, {impl}): "
          f"min {blocks[0]:.2f} us, median {blocks[len(blocks) // 2]:.2f} us per item "
          f"({len(blocks)} blocks of {BLOCK})")
    if trace:
        rows = trace[BLOCK:]  # (the first block is warm-up)
        for label, a, b in STAGES:
            if args.sink and b in (8, 9) and a != 3:
                continue
            spans = sorted(row[b] - row[a] for row in rows)
            print(f"  {label:<44} p50 {spans[len(spans) // 2] / 1e3:6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
