"""What the solver process's idle time proved (``control.precompute``), kept on disk per app.

Why: the precompute is minutes of idle time (every slice budget of every app, then each app's
value grid: about 20 minutes of CBC on the example node); a restarted daemon, or a solver
process restarted after a crash or a timeout, would plan its first spikes without it for that
long. Every fact is a proof about one app's problem: its columns (the app, the node, the
profiles, the search space, measured factors), its objective and weights, under the planner's
code. A file's name is a digest of all of these (``key_of``), so a changed input or an upgraded
planner starts a new file and never reads another's facts.

One JSON object per line, appended (under an exclusive lock) as each step answers; a line cut
short by a crash, or one that does not parse, is skipped when read::

    {"budget": BudgetFact, "limit_s": S}      one capacity solve within a budget
    {"top": RPS}                               the value grid's top demand
    {"level": RPS, "facts": [Fact, ...]}       one demand of the value grid
    {"bisect": [RPS, K, M], "facts": [Fact]}   one budget's feasibility bisected at a demand

The directory is ``$JIGSAW_PRECOMPUTE_CACHE`` or ``~/.cache/jigsaw/precompute`` (the ONNX
cache's way); an empty ``JIGSAW_PRECOMPUTE_CACHE`` keeps nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from jigsaw.node import Node
from jigsaw.planner.problem import Problem

ENV = "JIGSAW_PRECOMPUTE_CACHE"
FORMAT = 1  # the lines' format: a change starts new files
MAX_FILE_BYTES = 256 << 20  # a file past this is not read (its facts are computed again)
# the modules a fact's truth depends on besides its inputs: the planner's models and what they
# read (a change to any starts new files)
CODE = ("planner", "app.py", "mig.py", "node.py", "plan.py", "profiles.py", "shares.py", "spaces.py",
        "gpu_groups.py")


def cache_dir() -> Path | None:
    """Where the facts are kept (None: nowhere)."""
    got = os.environ.get(ENV)
    if got is not None:
        return Path(got) if got else None
    return Path.home() / ".cache" / "jigsaw" / "precompute"


@cache
def code_digest() -> str:
    """A digest of the sources in ``CODE`` (read once per process)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name in CODE:
        path = root / name
        for f in sorted(path.glob("*.py")) if path.is_dir() else [path]:
            h.update(f.name.encode())
            with contextlib.suppress(OSError):
                h.update(f.read_bytes())
    return h.hexdigest()


def key_of(pb: Problem, node: Node, scope: tuple[str, float, float]) -> str:
    """The digest of everything ``pb``'s facts under ``scope`` hold for: the app (not the file it
    was read from), the node's GPUs and planner settings (not its other apps, server or control
    settings, nor the solver's time limits), the profile rows, the space, the factors, the scope,
    the planner's code and the format."""
    app = dataclasses.replace(pb.app, source="")
    planner = {k: v for k, v in dataclasses.asdict(node.planner).items()
               if k not in ("time_limit_s", "precompute_step_s")}
    where = dataclasses.replace(node, apps=(), source="", planner=type(node.planner)(),
                                server=type(node.server)(), control=type(node.control)())
    rows = sorted(repr(r) for r in pb.profiles.rows()) if pb.profiles is not None else []
    factors = sorted(pb.factors.items()) if pb.factors else None
    h = hashlib.sha256()
    for part in (FORMAT, code_digest(), app, where, sorted(planner.items()), rows, pb.space, factors, scope):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


class Store:
    """The files of one solver process's apps (``paths[i]``: app i's)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    @staticmethod
    def of(pbs: list[Problem], node: Node, scopes: list[tuple[str, float, float]],
           directory: Path | None) -> Store | None:
        """The store for the apps' problems in ``directory`` (None: nowhere; also when it cannot
        be made)."""
        if directory is None:
            return None
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            return None
        return Store([directory / f"{pb.app.name}-{key_of(pb, node, sc)}.jsonl"
                      for pb, sc in zip(pbs, scopes, strict=True)])

    def read(self, i: int) -> Iterator[dict[str, Any]]:
        """App i's records in the order they were written (those that do not parse skipped)."""
        path = self.paths[i]
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                return
            data = path.read_bytes()
        except OSError:
            return
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    yield doc

    def append(self, i: int, record: dict[str, Any]) -> None:
        """One record at the end of app i's file (a failure to write loses only this record)."""
        line = json.dumps(record).encode() + b"\n"
        with contextlib.suppress(OSError):
            fd = os.open(self.paths[i], os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # another solver process of the same node waits
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # after a line a crash cut short, not glued to it
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
