"""Layers import only downward and no modules import each other in a cycle (ARCHITECTURE.md).

Every ``import`` of a ``jigsaw`` module counts, also inside functions (a lazy import is still a
dependency); only imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# lowest first; a module may import its own layer and those below. A module matches the longest
# listed prefix. Modules in none of them are checked for cycles only (classify new ones here).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("vocabulary", ("jigsaw", "jigsaw.errors", "jigsaw.fields", "jigsaw.mig", "jigsaw.spaces",
                    "jigsaw.tensors", "jigsaw.profiles", "jigsaw.shares", "jigsaw.app", "jigsaw.plan",
                    "jigsaw.node", "jigsaw.gpu_groups",
                    "jigsaw.traces", "jigsaw.backends.registry", "jigsaw.models.catalog",
                    "jigsaw.models.repository")),
    ("planner and models", ("jigsaw.planner", "jigsaw.models")),
    ("node hardware and fleet plans", ("jigsaw.gpu", "jigsaw.fleet")),
    ("backends", ("jigsaw.backends",)),
    ("runtime", ("jigsaw.runtime",)),
    ("control", ("jigsaw.control",)),
    ("entry points", ("jigsaw.daemon", "jigsaw.cli", "jigsaw.demo", "jigsaw.profiler", "jigsaw.profiler_gpu",
                      "jigsaw.modeled", "jigsaw.profile_import",
                      "jigsaw.profiling", "jigsaw.testing")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and \
                    (prefix != "jigsaw" or module == "jigsaw") and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The jigsaw modules ``path`` imports (``from jigsaw.x import y`` counts ``jigsaw.x.y`` if a module)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("jigsaw"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jigsaw"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return {m for m in out if m in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.joinpath("jigsaw").rglob("*.py")}
    modules = set(paths)
    return {m: _imports(p, modules) - {m} for m, p in paths.items()}


def test_every_import_goes_down_or_sideways() -> None:
    upward = []
    for module, deps in sorted(_graph().items()):
        mine = _layer(module)
        for dep in sorted(deps):
            theirs = _layer(dep)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{module} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[theirs][0]})")
    assert not upward, "imports from a layer above:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from jigsaw.runtime.frontend import Frontend\n")
    assert _imports(f, {"jigsaw.runtime.frontend"}) == {"jigsaw.runtime.frontend"}
    assert _layer("jigsaw.node") < _layer("jigsaw.runtime.frontend")  # type: ignore[operator]
    assert _layer("jigsaw.backends.registry") == 0 and _layer("jigsaw.backends.emulated") == 3
