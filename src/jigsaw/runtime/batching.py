"""Per-instance batching queue with deadline-aware early dropping (paper §3.3).

``BatchQueue`` is the compiled ``jigsaw._core.BatchQueue`` when built (and ``JIGSAW_NO_EXTENSIONS``
is not ``1``), else the pure-Python one; both follow the rules documented on
``jigsaw.runtime._pybatching.BatchQueue``.
"""

from __future__ import annotations

from jigsaw.runtime import _pybatching
from jigsaw.runtime._pybatching import Dropped, DropReason, Entry
from jigsaw.runtime.rings import load_core

__all__ = ["HAS_EXTENSION", "BatchQueue", "DropReason", "Dropped", "Entry"]

_core = load_core()
HAS_EXTENSION = _core is not None
if _core is not None:
    BatchQueue = _core.BatchQueue
else:
    BatchQueue = _pybatching.BatchQueue  # type: ignore[misc]
