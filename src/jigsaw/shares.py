"""MPS shares: k processes of any (task, variant)s under one MPS control daemon, on a whole GPU or
in one MIG instance (ParvaGPU / BOER style co-location; the paper's segments hold one (task,
variant) only).

A whole GPU split into k shares (``mig.whole_gpu_model(..., shares=k)``) runs k worker
processes, each its own (task, variant, max batch), with no active-thread cap. The planner sees
each process as an instance of the profile ``gpu-1of<k>`` (one compute slice of the GPU's k):
the packer lays up to k of them on a GPU, and the runtime starts one MPS daemon per GPU that
holds shares (its processes' ``CUDA_VISIBLE_DEVICES`` is the GPU: ``runtime/gpus.py``
``device_slot``).

A MIG instance of profile P shared by k processes (``mig.with_mig_shares``, the node file's
``[gpus] mig_shares = ["1g.10gb-1of2", ...]``, by default the smallest instance at every k of
``mps_levels`` among 2, 3, 4) is the profile ``P-1of<k>``: P's geometry, a k-th of its memory, a
k-th of its compute slices as a plan's slices (``MigProfile.slice_cost``). The planner chooses them
after the MILPs, over their homogeneous plan (``planner/share_merge.py``: the idle tails of small
tasks moved into shared instances where that frees slices, the lanes kept). Listed among
``mig_profiles`` they enter the MILPs too (slices counted in k-ths, ``mig.slice_unit``): J
instances of P per share level (k J >= its shares) beside P's own against the per-GPU layout
vectors over devices (``planner/problem.py`` ``share_hosts``), so every plan packs, a shared
instance paid whole (its empty seats too); the packer lays up to k shares
into one instance of P and only there (``planner/packer.py`` ``bundle_shares``), each with its
seat; the node layout carries the seats (``gpu/layout.py``) and
the runtime creates the one instance (``NodeInstance.device_slot``) and starts its one MPS daemon
before its mixed processes, of any tasks and apps. P itself at MPS level k (the homogeneous
segment) stays, so shares only add choices: a plan never needs more slices with them.

The interference model (stated): a process in a share runs at the per-process rate of its own
variant's level-k row of its host (the whole GPU or P: the k - 1 neighbours busy copies of itself,
the level-k rows being measured or modeled with all k processes busy) times ``SHARE_INTERFERENCE``,
its batch latency over that factor, memory as the row's (at most the host's k-th: the planner's
memory check). What it assumes: (1) a neighbour unlike a process costs it at most 15% more than a
copy of itself would, whatever the pair: the factor is from the H200 (``shared/data/gpu/README.md``):
efficientnet-b0 beside vgg11 under one MPS daemon kept 0.85 of its alone throughput (vgg11 1.12),
where efficientnet-b0's own modeled level-2 row keeps 0.97; (2) the same holds in a MIG instance
as on the whole GPU (MPS divides an instance's SMs as it does a GPU's; not measured: no MIG on the
H200 lent); (3) neighbours are busy all the time, so a lightly loaded neighbour only helps.
Applied to every share (also one whose neighbours happen to be its copies), it errs on the safe
side. A row the profile table has for a share itself (measured with mixed neighbours) is used
instead of the derived one.

No active-thread cap (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``): on the H200 an even 50% cap cost
vgg11 37% of its throughput against none and gained efficientnet-b0 5%, so an even share never
paid there; the rows describe uncapped processes.
"""

from __future__ import annotations

from dataclasses import replace

from jigsaw.mig import WHOLE_GPU, GpuModel
from jigsaw.profiles import ProfileRow, ProfileTable

SHARE_INTERFERENCE = 0.85
"""A share's throughput against its level-k per-process row (the H200 pair: see above)."""


def share_profile(gpu: GpuModel) -> str:
    """The GPU's whole-GPU share profile name, or "" when its processes do not share it whole."""
    return next((p.name for p in gpu.profiles if p.share_of and not p.host), "")


def share_rows(rows: list[ProfileRow], k: int, share: str, host: str = WHOLE_GPU) -> list[ProfileRow]:
    """One share row per level-k row of ``host`` (the whole GPU or a MIG instance's profile): the
    same batch and per-process memory, a k-th of the segment's throughput and the row's latency,
    each by ``SHARE_INTERFERENCE``."""
    return [replace(r, mig_profile=share, mps=1,
                    latency_ms=round(r.latency_ms / SHARE_INTERFERENCE, 4),
                    throughput_rps=round(r.throughput_rps / k * SHARE_INTERFERENCE, 3))
            for r in rows if r.mig_profile == host and r.mps == k]


def with_share_rows(table: ProfileTable, gpu: GpuModel) -> ProfileTable:
    """``table`` with the share rows of every share profile of ``gpu`` added (a whole GPU's, a
    MIG instance's); a row the table has for the share itself (measured with mixed neighbours)
    is kept, not derived."""
    shares = [p for p in gpu.profiles if p.share_of]
    if not shares:
        return table
    rows = table.rows()
    derived = [r for p in shares for r in share_rows(rows, p.share_of, p.name, p.host or WHOLE_GPU)
               if r.key not in table]
    return table.with_rows(derived) if derived else table
