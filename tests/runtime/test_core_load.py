"""The compiled core is used only when it has everything the Python layers call on it: a build
from older sources falls back to the pure implementations with a message, instead of failing
every request at its first missing function."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

import jigsaw
from jigsaw.runtime import rings

SRC = Path(jigsaw.__file__).parent


def test_core_names_are_what_the_code_uses() -> None:
    used = set()
    for path in SRC.rglob("*.py"):
        used |= set(re.findall(r"\b_core\.([A-Za-z_]\w*)", path.read_text()))
    used -= {"__file__"}
    assert used == set(rings.CORE_NAMES)


def test_a_stale_core_is_refused_with_a_message(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    stale = types.ModuleType("jigsaw._core")
    stale.__file__ = "/nowhere/_core.so"
    for name in rings.CORE_NAMES[:-1]:
        setattr(stale, name, object())
    monkeypatch.setitem(sys.modules, "jigsaw._core", stale)
    monkeypatch.setattr(jigsaw, "_core", stale, raising=False)
    monkeypatch.setattr(rings, "_core_warned", False)
    monkeypatch.delenv("JIGSAW_NO_EXTENSIONS", raising=False)
    assert rings.load_core() is None
    err = capsys.readouterr().err
    assert "/nowhere/_core.so" in err and rings.CORE_NAMES[-1] in err and "build_ext" in err
    assert rings.load_core() is None
    assert capsys.readouterr().err == ""  # said once

    setattr(stale, rings.CORE_NAMES[-1], object())  # complete: used
    assert rings.load_core() is stale
