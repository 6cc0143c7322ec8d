"""Builds the Cython hot path (``native/*.pyx`` -> ``jigsaw._native``).

``JIGSAW_DEBUG=1`` builds with line tracing and C asserts for coverage and debugging.
Without a compiler the package still installs; the pure-Python fallback is then used.
"""

import os
from pathlib import Path

from setuptools import setup

ext_modules = []
sources = sorted(str(p) for p in Path("native").glob("*.pyx"))
if sources:
    import runpy

    from Cython.Build import cythonize

    # the pure-Python ring reads the layout core.pxd declares: regenerate it before compiling
    if Path("native/ring_layout.py").exists():
        runpy.run_path("native/ring_layout.py")["main"]([])
    from setuptools import Extension

    debug = os.environ.get("JIGSAW_DEBUG") == "1"
    macros = [("CYTHON_TRACE_NOGIL", "1")] if debug else [("NDEBUG", "1")]
    ext_modules = cythonize(
        [Extension(f"jigsaw._{Path(s).stem}", [s], define_macros=macros,
                   extra_compile_args=["-O2"] if not debug else ["-O0", "-g"])
         for s in sources],
        compiler_directives={"language_level": "3", "boundscheck": debug, "wraparound": False,
                             "linetrace": debug},
        include_path=["native"],  # core.pxd: the ring's byte layout
        quiet=True,
    )

setup(ext_modules=ext_modules)
