"""Reconfiguring a GPU node: its one running layout, diffs, MIG through NVML, MPS, and the executor.

``layout`` (the node's layout, all apps; ``place_app``) -> ``diff`` (pure: keep / create /
replace / remove, ordered) -> ``executor`` (applies it with ``nvml.MigApplier``, ``mps.MpsManager``
and the daemon's worker callbacks, rolling back on any failure). ``emulated_nvml`` stands in for
the driver on nodes without GPUs; ``doctor`` says what a GPU node lacks.
"""
