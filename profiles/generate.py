"""The modeled-profile generator now lives in the package: ``jigsaw modeled`` (``jigsaw.modeled``).

    python profiles/generate.py [--gpu H100-80GB] [--out profiles/h100-80gb]   # as jigsaw modeled
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import jigsaw.modeled
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import jigsaw.modeled

from jigsaw.modeled import *  # noqa: F403  (generate, write, variants, GPU_SPECS ... for old callers)

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--out" not in argv:  # this folder's profiles/<gpu>, as before
        gpu = argv[argv.index("--gpu") + 1] if "--gpu" in argv else "H100-80GB"
        argv += ["--out", str(Path(__file__).resolve().parent / gpu.lower())]
    raise SystemExit(jigsaw.modeled.main(argv))
