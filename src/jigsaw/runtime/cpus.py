"""Which CPUs a worker of a CPU node runs on: a core share's placement -> real CPUs.

A CPU node declares ``total_slices`` cores laid on the 8 placement slots like MIG; the host may
have fewer (``examples/cpu.toml`` declares four 1-core shares on two cores). Declared core c runs
on real CPU ``real[c * len(real) // declared]``, so shares time-share a real core exactly when
the declaration oversubscribes it, and a worker is pinned to its share's CPUs
(``JIGSAW_CPUS``) with as many threads as it has CPUs. ``jigsaw profile`` measures a share with
the others of its real CPUs busy (``sharing``), so the plan's capacity is what the host gives.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from jigsaw.mig import NUM_PLACEMENT_SLOTS, GpuModel

ENV = "JIGSAW_CPUS"


def host_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def share_cpus(device: GpuModel, profile: str, start: int, real: Sequence[int]) -> list[int]:
    """The real CPUs of the ``profile`` share placed at slot ``start``."""
    declared = device.total_slices
    first = start * declared // NUM_PLACEMENT_SLOTS
    cores = range(first, first + device.profile(profile).compute_slices)
    return sorted({real[c * len(real) // declared] for c in cores})


def sharing(device: GpuModel, profile: str, real: Sequence[int]) -> int:
    """How many shares of ``profile`` run at once on one such share's real CPUs (1: alone)."""
    cpus = share_cpus(device, profile, 0, real)
    declared_on_them = len(cpus) * device.total_slices / len(real)
    return max(1, int(declared_on_them // device.profile(profile).compute_slices))


def pin_from_env() -> int | None:
    """Pin this process to ``$JIGSAW_CPUS`` (comma-separated); the number of CPUs, or None if unset."""
    value = os.environ.get(ENV)
    if not value:
        return None
    cpus = {int(c) for c in value.split(",")}
    os.sched_setaffinity(0, cpus)
    return len(cpus)
