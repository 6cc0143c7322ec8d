"""Typed access to TOML tables that turns every mistake into a ConfigError naming the field."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

from jigsaw.errors import ConfigError

_MISSING = object()
_IMPORT_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def check_import_ref(ref: str) -> str | None:
    """Why ``ref`` is not a ``module:function`` import path (None when it is one)."""
    if not _IMPORT_REF.fullmatch(ref):
        return f"expected 'module:function' (an import path), got {ref!r}"
    return None


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(path), "(file)", "no such file") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "(file)", "is a directory, expected a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "(syntax)", f"not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "(file)", "not UTF-8 text") from None


class Fields:
    """A TOML table plus where it came from, so that errors can name ``file: a.b[2].c``."""

    def __init__(self, path: str | Path, table: Any, where: str = "") -> None:
        self.path = str(path)
        self.where = where
        if not isinstance(table, dict):
            raise ConfigError(self.path, where or "(top)", f"expected a table, got {_kind(table)}")
        self.table: dict[str, Any] = table

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.path, self.name(key), message)

    def has(self, key: str) -> bool:
        return key in self.table

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key not in self.table:
            if default is _MISSING:
                raise self.error(key, "missing (required)")
            return default
        return self.table[key]

    def str(self, key: str, default: Any = _MISSING) -> str:
        if key not in self.table and default is not _MISSING:
            return default
        value = self.raw(key)
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {_kind(value)}")
        return value

    def number(self, key: str, default: Any = _MISSING, *, low: float | None = None,
               high: float | None = None, low_open: bool = False, integer: bool = False) -> float:
        if key not in self.table and default is not _MISSING:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"expected a number, got {_kind(value)}")
        if integer and (not isinstance(value, int)):
            raise self.error(key, f"expected an integer, got {value!r}")
        if low is not None and (value < low or (low_open and value == low)):
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            raise self.error(key, f"expected a number {bound}, got {value!r}")
        if high is not None and value > high:
            raise self.error(key, f"expected a number <= {high:g}, got {value!r}")
        return value

    def integer(self, key: str, default: Any = _MISSING, *, low: int | None = None,
                high: int | None = None) -> int:
        return int(self.number(key, default, low=low, high=high, integer=True))

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_kind(value)}")
        return value

    def tables(self, key: str, default: Any = _MISSING) -> list[Fields]:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise self.error(key, f"expected an array of tables, got {_kind(value)}")
        return [Fields(self.path, item, f"{self.name(key)}[{i}]") for i, item in enumerate(value)]

    def sub(self, key: str, default: Any = _MISSING) -> Fields:
        return Fields(self.path, self.raw(key, default), self.name(key))

    def list(self, key: str, default: Any = _MISSING) -> list[Any]:
        value = self.raw(key, default)
        if not isinstance(value, list):
            raise self.error(key, f"expected an array, got {_kind(value)}")
        return value

    def reject_unknown(self, known: set[str]) -> None:
        for key in self.table:
            if key not in known:
                allowed = ", ".join(sorted(known))
                raise self.error(key, f"unknown field (expected one of: {allowed})")


def _kind(value: Any) -> str:
    if value is _MISSING:
        return "nothing"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"{type(value).__name__} {value!r}"


def parse_demands(text: str) -> dict[str, float]:
    """``--demand app=rps,app=rps`` (the CLI's node and fleet plans); a ConfigError naming the flag."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError("--demand", "--demand", f"expected app=rps pairs, got {item!r}")
        try:
            rps = float(value)
        except ValueError:
            raise ConfigError("--demand", "--demand",
                              f"{name.strip()}: expected a number, got {value!r}") from None
        if name.strip() in out:
            raise ConfigError("--demand", "--demand", f"app {name.strip()!r} given twice")
        out[name.strip()] = rps
    if not out:
        raise ConfigError("--demand", "--demand", "expected app=rps pairs")
    return out
