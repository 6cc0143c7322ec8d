"""Generate ``src/jigsaw/runtime/ring_layout.py`` from ``native/core.pxd``, the ring layout's one declaration.

    python native/ring_layout.py [--check]

``setup.py build_ext`` runs it before compiling; ``--check`` exits 1 when the generated module is
out of date (``tests/runtime/test_ring_layout.py`` checks the same), so the compiled and the
pure-Python ring cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PXD = ROOT / "native" / "core.pxd"
OUT = ROOT / "src" / "jigsaw" / "runtime" / "ring_layout.py"
_STRUCT_CODES = {"uint64_t": "Q", "uint32_t": "I", "uint16_t": "H", "uint8_t": "B"}


def parse(pxd: str) -> tuple[dict[str, int], list[tuple[str, str, int]]]:
    """(constants, header fields as (name, struct code, count)) declared in ``core.pxd``."""
    consts: dict[str, int] = {}
    magic = re.search(r"#define JG_MAGIC (0x[0-9A-Fa-f]+)ULL", pxd)
    if magic is None:
        raise ValueError(f"{PXD}: no '#define JG_MAGIC 0x...ULL'")
    consts["MAGIC"] = int(magic.group(1), 16)
    enum = pxd.split("\ncdef enum:\n", 1)
    if len(enum) != 2:
        raise ValueError(f"{PXD}: no 'cdef enum:' block")
    for line in enum[1].splitlines():
        m = re.fullmatch(r"    ([A-Z_][A-Z0-9_]*) = (0x[0-9A-Fa-f]+|\d+)", line)
        if m is None:
            if line.strip():
                break
            continue
        consts[m.group(1)] = int(m.group(2), 0)
    body = pxd.split("    ctypedef struct jg_header_t:\n", 1)
    if len(body) != 2:
        raise ValueError(f"{PXD}: no 'ctypedef struct jg_header_t:' declaration")
    fields = []
    for line in body[1].splitlines():
        m = re.fullmatch(r"        (uint\d+_t) (\w+)(?:\[(\d+)\])?", line)
        if m is None:
            break
        fields.append((m.group(2), _STRUCT_CODES[m.group(1)], int(m.group(3) or 1)))
    return consts, fields


def render(consts: dict[str, int], fields: list[tuple[str, str, int]]) -> str:
    lines = ['"""The ring\'s byte layout for the pure-Python ring: GENERATED from native/core.pxd.',
             "",
             "Do not edit: change ``native/core.pxd`` and run ``python native/ring_layout.py``.",
             '"""', "", "from __future__ import annotations", ""]
    for name, value in consts.items():
        hexadecimal = name in ("MAGIC", "KIND_DATA", "KIND_SKIP")
        lines.append(f"{name} = {value:#x}" if hexadecimal else f"{name} = {value}")
    lines += ["", "# the record header's fields in order: (name, struct code, count)", "HEADER_FIELDS = ("]
    lines += [f"    ({n!r}, {c!r}, {k})," for n, c, k in fields]
    lines += [")", ""]
    return "\n".join(lines)


def generated() -> str:
    return render(*parse(PXD.read_text()))


def main(argv: list[str]) -> int:
    text = generated()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date with {PXD}: run python native/ring_layout.py", file=sys.stderr)
            return 1
        return 0
    if not OUT.exists() or OUT.read_text() != text:
        OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
