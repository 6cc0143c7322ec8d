"""The image size a node serves its zoo models at is the size their profile rows were measured at.

Why: a zoo detector or classifier runs at ``JIGSAW_DETECTOR_SIZE`` / ``JIGSAW_CLASSIFIER_SIZE``
(640 / 224 by default; a CPU node measures smaller ones). Served at another size than its
measured rows, every plan is wrong: latencies are off by the square of the ratio. A measured row
records its input (``profiles.ProfileRow.input``, "320px"); at start the node takes that size
when the variable is unset, and warns, naming both sizes, when it is set to another (a smaller
size on purpose, say, for a quick test).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from jigsaw.app import App
from jigsaw.errors import JigsawError
from jigsaw.profiles import ProfileTable

SIZE_VARIABLES = {"detector": ("JIGSAW_DETECTOR_SIZE", 640), "classifier": ("JIGSAW_CLASSIFIER_SIZE", 224)}


def measured_sides(apps: Iterable[App], profiles: ProfileTable) -> dict[str, dict[int, list[str]]]:
    """For each size variable, the sides the measured rows of its zoo variants record, with the
    variants measured at each."""
    out: dict[str, dict[int, list[str]]] = {}
    for app in apps:
        for task in app.tasks:
            if task.kind not in SIZE_VARIABLES:
                continue
            var = SIZE_VARIABLES[task.kind][0]
            for v in task.variants:
                if v.resolved is None or v.resolved.is_onnx:
                    continue  # a repository model's input is its graph's
                for r in profiles.rows(v.name):
                    if r.source == "measured" and r.input.endswith("px") and r.input[:-2].isdigit():
                        names = out.setdefault(var, {}).setdefault(int(r.input[:-2]), [])
                        if v.name not in names:
                            names.append(v.name)
    return out


def serve_at_measured_sizes(apps: Iterable[App], profiles: ProfileTable, log: Callable[[str], None],
                            environ: dict[str, str] | None = None) -> None:
    """Set each unset size variable to the size the rows were measured at (logged); a warning
    when it is set to another; a ``JigsawError`` when the rows disagree."""
    env = os.environ if environ is None else environ
    for var, sides in measured_sides(apps, profiles).items():
        if len(sides) > 1:
            seen = "; ".join(f"{', '.join(vs)} at {side}px" for side, vs in sorted(sides.items()))
            raise JigsawError(f"profile rows measured at different image sizes ({seen}): one {var} "
                              "serves them all; measure them again at one size (jigsaw profile)")
        (side, variants), = sides.items()
        default = dict(SIZE_VARIABLES.values())[var]
        have = env.get(var)
        if have is None:
            if side != default:
                env[var] = str(side)
                log(f"serving {', '.join(variants)} at {side}px, the size their profile rows were "
                    f"measured at ({var}={side})")
        elif have.strip() != str(side):
            log(f"warning: {var}={have}, but the profile rows of {', '.join(variants)} were measured at "
                f"{side}px: their plans' latencies do not hold; unset {var} to serve at {side}px, or "
                f"measure the rows again at {have}px (jigsaw profile)")
