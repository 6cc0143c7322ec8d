"""The control tests reuse the data-plane server fixture (``tests/dataplane/dpserver.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataplane"))
