"""Where a CPU node's core shares run on the host's CPUs."""

from __future__ import annotations

import pytest

from jigsaw.mig import cpu_model
from jigsaw.runtime.cpus import share_cpus, sharing

CPU4 = cpu_model(4)


@pytest.mark.parametrize(("real", "by_profile", "shared"), [
    # four declared cores on two CPUs: two 1c shares per CPU, a 2c share has a CPU to itself
    ([0, 1], {"1c": [[0], [0], [1], [1]], "2c": [[0], [1]], "4c": [[0, 1]]}, {"1c": 2, "2c": 1, "4c": 1}),
    ([5], {"1c": [[5]] * 4, "2c": [[5]] * 2, "4c": [[5]]}, {"1c": 4, "2c": 2, "4c": 1}),
    ([0, 1, 2, 3], {"1c": [[0], [1], [2], [3]], "2c": [[0, 1], [2, 3]], "4c": [[0, 1, 2, 3]]},
     {"1c": 1, "2c": 1, "4c": 1}),
    ([0, 2, 4, 6, 8, 10, 12, 14], {"1c": [[0], [4], [8], [12]], "2c": [[0, 4], [8, 12]],
                                   "4c": [[0, 4, 8, 12]]}, {"1c": 1, "2c": 1, "4c": 1}),
])
def test_shares_map_onto_the_hosts_cpus(real, by_profile, shared):
    for p in CPU4.profiles:
        assert [share_cpus(CPU4, p.name, start, real) for start in p.starts] == by_profile[p.name]
        assert sharing(CPU4, p.name, real) == shared[p.name]
