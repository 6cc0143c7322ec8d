"""Typed access to TOML tables that turns every mistake into a ConfigError naming the field, and
the node file's sections declared once (``section``, ``setting``)."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticUndefined

from jigsaw.errors import ConfigError

_MISSING = object()
_T = TypeVar("_T")
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


# --- settings declared once -------------------------------------------------------------------
#
# A section of the node file (``[planner]``, ``[server]``, ``[control]``) is a frozen pydantic
# dataclass whose every field is one ``setting(...)``: its type, default, bounds and one-line
# meaning. The loader (``load_section``), the errors (``ConfigError`` naming file and field), the
# defaults of ``Section()`` and the reference page (``reference``) all come from that declaration.

SECTION_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def section(cls: type[_T]) -> type[_T]:
    """Declares a node-file section: a frozen dataclass validated by pydantic on construction
    (also by ``dataclasses.replace``), unknown fields refused, TOML types taken strictly (no
    ``"1"`` for 1, no 1 for true; an integer is a number)."""
    return pydantic_dataclass(frozen=True, config=SECTION_CONFIG)(cls)


def setting(default: Any, meaning: str, *, group: str = "", strict: bool | None = None,
            toml_type: str = "", **bounds: Any) -> Any:
    """One setting: ``default``, a one-line ``meaning`` (the reference's text), the ``group`` it
    is listed under, and pydantic bounds (``ge``, ``gt``, ``le``, ``lt``, ``min_length``).
    ``strict=False`` lets a TOML array fill a tuple; ``toml_type`` names the TOML type in the
    reference where the Python type does not say it."""
    extra = {k: v for k, v in (("group", group), ("toml_type", toml_type)) if v} or None
    return Field(default=default, description=meaning, json_schema_extra=extra, strict=strict,
                 **bounds)


def load_section(cls: type[_T], fields: Fields, removed: dict[str, str] | None = None) -> _T:
    """``cls`` from the TOML table ``fields``; a removed key names what replaced it, and every
    other mistake becomes a ConfigError naming the file and ``section.key``."""
    for key in fields.table:
        if removed and key in removed:
            raise fields.error(key, f"removed: {removed[key]}")
    try:
        return cls(**fields.table)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = [str(p) for p in err["loc"]]
        key = loc[0] + "".join(f"[{p}]" for p in loc[1:]) if loc else "(table)"
        raise fields.error(key, _message(err, cls)) from None


def _message(err: Any, cls: type) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input", _MISSING)
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"expected a number {bounds[kind]} {limit:g}, got {got!r}"
    if kind == "unexpected_keyword_argument":
        allowed = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
        return f"unknown field (expected one of: {allowed})"
    if kind == "missing_argument" or kind == "missing":
        return "missing (required)"
    if kind == "literal_error":
        field = cls.__pydantic_fields__.get(str(err["loc"][0]))  # type: ignore[attr-defined]
        choices = ", ".join(map(str, get_args(field.annotation))) if field else ctx.get("expected")
        return f"expected one of {choices}, got {got!r}"
    if kind in ("int_type", "int_from_float"):
        return f"expected an integer, got {_kind(got)}"
    if kind in ("float_type", "finite_number"):
        return f"expected a number, got {_kind(got)}"
    if kind == "bool_type":
        return f"expected true or false, got {_kind(got)}"
    if kind == "string_type":
        return f"expected a string, got {_kind(got)}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {_kind(got)}"


def reference(cls: type, name: str) -> str:
    """The Markdown reference of one section, generated from its declaration: per group a table
    of key, type, default, bounds and meaning."""
    rows: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        info = cls.__pydantic_fields__[f.name]  # type: ignore[attr-defined]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        bounds = " ".join(_bound(m) for m in info.metadata if _bound(m))
        kind = str(extra.get("toml_type", "")) or _type_name(info.annotation)
        rows.setdefault(str(extra.get("group", "")), []).append(
            f"| `{f.name}` | {kind} | `{'{}' if kind == 'table' else _toml(info.default)}` | "
            f"{bounds} | {info.description} |")
    out = [f"## `[{name}]`", ""]
    for group, lines in rows.items():
        if group:
            out += [f"### {group}", ""]
        out += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|", *lines, ""]
    return "\n".join(out)


def _bound(m: Any) -> str:
    for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        value = getattr(m, attr, None)
        if value is not None:
            return f"{sign} {value:g}"
    return ""


def _type_name(annotation: Any) -> str:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if len(args) < len(get_args(annotation)) and len(args) == 1:  # X | None: None is the derived default
        return _type_name(args[0])
    if get_origin(annotation) is tuple:
        return "array"
    if get_origin(annotation) is Literal:
        return " \\| ".join(f'`"{a}"`' for a in get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return {"float": "number", "int": "integer", "bool": "boolean", "str": "string"}.get(
        text, str(annotation).replace("|", "\\|").replace("typing.", ""))


def _toml(value: Any) -> str:
    if value is None:
        return "(derived)"
    if value is PydanticUndefined or value is Ellipsis:
        return "(required)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
