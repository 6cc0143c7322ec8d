"""The ring's byte layout is declared once (native/core.pxd); the pure ring's constants follow it."""

from __future__ import annotations

import runpy
from pathlib import Path

from jigsaw.runtime import ring_layout

ROOT = Path(__file__).resolve().parents[2]


def test_generated_layout_is_up_to_date_with_core_pxd() -> None:
    gen = runpy.run_path(str(ROOT / "native" / "ring_layout.py"))
    assert (ROOT / "src" / "jigsaw" / "runtime" / "ring_layout.py").read_text() == gen["generated"](), \
        "core.pxd changed: run python native/ring_layout.py"


def test_layout_constants_are_consistent() -> None:
    assert int.from_bytes(b"JIGSAWR1", "little") == ring_layout.MAGIC
    assert ring_layout.RECORD_OVERHEAD_BYTES == ring_layout.FRAME_BYTES + ring_layout.HEADER_BYTES
    sizes = {"Q": 8, "I": 4, "H": 2, "B": 1}
    assert sum(sizes[code] * n for _, code, n in ring_layout.HEADER_FIELDS) == ring_layout.HEADER_BYTES
    assert ring_layout.PUSHED_OFFSET - ring_layout.TAIL_OFFSET == 8
    assert ring_layout.HEAD_OFFSET >= ring_layout.PUSHED_OFFSET + 64  # producer and consumer lines apart
    assert ring_layout.CONTROL_BYTES >= ring_layout.POPPED_OFFSET + 8


def test_a_change_in_core_pxd_shows_in_the_generated_module() -> None:
    gen = runpy.run_path(str(ROOT / "native" / "ring_layout.py"))
    pxd = (ROOT / "native" / "core.pxd").read_text().replace("    NUM_HOPS = 8\n", "    NUM_HOPS = 9\n")
    consts, fields = gen["parse"](pxd)
    assert consts["NUM_HOPS"] == 9 and fields[-1] == ("hops", "Q", 8)
    assert "NUM_HOPS = 9" in gen["render"](consts, fields)
