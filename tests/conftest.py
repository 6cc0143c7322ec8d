"""Suite-wide: ``tests/`` on the path, and the ``--fallback-pass`` selection of ``make test``.

``make test`` runs the suite twice: once as built (compiled ``jigsaw._core``), then
``JIGSAW_NO_EXTENSIONS=1 pytest --fallback-pass tests/runtime tests/dataplane``, which serves every
ring, batching and dispatch path of those directories again through the pure-Python fallbacks. The
second pass drops what would only repeat the first: the tests parametrized over the implementation
(``impl``: both ran in the first pass, each importing its own classes) and the second HTTP front end
(the front is independent of the ring implementation; the first pass ran both).
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

H100X4 = ROOT / "examples" / "h100x4.toml"


@pytest.fixture(scope="module")
def one_gpu():
    """One H100 of ``examples/h100x4.toml`` and its profiles: the planner tests' small node."""
    from jigsaw.node import load_node, load_node_profiles

    node = load_node(H100X4).with_gpus(1)
    return node, load_node_profiles(node)


@pytest.fixture
def cold_planner() -> None:
    """The test starts cold: no problem, hence no curve (``planner.curves``), kept from another."""
    from jigsaw.planner import problem

    problem.forget()


DEFAULT_FRONT = "fast"  # ``[server] http``'s default; the fallback pass serves through it only


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fallback-pass", action="store_true",
                     help="the JIGSAW_NO_EXTENSIONS=1 pass: skip tests that would repeat the first pass")


def repeats_the_first_pass(item: pytest.Item) -> bool:
    """Whether ``item`` runs the same code with and without the compiled core."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "impl" in params or {"pure_impl", "compiled_impl"} & set(getattr(item, "fixturenames", ())):
        return True
    return params.get("http_front", DEFAULT_FRONT) != DEFAULT_FRONT


def pytest_configure(config: pytest.Config) -> None:
    # the solver processes of the daemons started here keep no precompute (``control.precompute_store``):
    # every test starts from what it computes itself, and nothing is written under the home directory
    os.environ.setdefault("JIGSAW_PRECOMPUTE_CACHE", "")
    if config.getoption("--fallback-pass") and os.environ.get("JIGSAW_NO_EXTENSIONS") != "1":
        raise pytest.UsageError("--fallback-pass needs JIGSAW_NO_EXTENSIONS=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fallback-pass"):
        return
    keep = [i for i in items if not repeats_the_first_pass(i)]
    dropped = [i for i in items if repeats_the_first_pass(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
