"""The modeled profile rows against rows measured on a real GPU, with ratios.

`jigsaw modeled` computes rows for GPUs nobody measured (`profiles/README.md`, the assumptions it
prints); `../shared/data/gpu/` holds what one H200 (whole, MIG off, torch eager) measured: the
served pipeline (`h200-pipeline-measured.csv`, `jigsaw profile --backend torch` at MPS 1, 2, 4) and
the network alone, input already on the GPU (`h200-model-alone.csv`, fp32 and fp16). For every
measured (variant, MPS level, batch) it prints the modeled row of the same whole-GPU segment beside
them: items/s and p95, served / modeled, alone / modeled, and the pipeline's efficiency (served /
the network alone at its best dtype).

    python bench/modeled_vs_measured.py [--data DIR] [--measured CSV] [--alone CSV] [--gpu H200] [--json]

`--measured` takes any `jigsaw profile` CSV of whole-GPU rows (e.g. one `scripts/gpu-check` wrote);
the shared files are read where they lie (never copied into the repository).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    from jigsaw.modeled import GPU_SPECS, PIPELINE_ASSUMPTIONS, segment_row, variants
    from jigsaw.profiles import read_profile_csv
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))
    from jigsaw.modeled import GPU_SPECS, PIPELINE_ASSUMPTIONS, segment_row, variants
    from jigsaw.profiles import read_profile_csv

# ../shared/data beside the checkout (a worktree one level deeper finds it one level up)
GPU_DATA = next((d / "shared" / "data" / "gpu" for d in (ROOT.parent, ROOT.parent.parent)
                 if (d / "shared" / "data" / "gpu").is_dir()), ROOT.parent / "shared" / "data" / "gpu")


def read_alone(path: Path) -> dict[tuple[str, str, int], dict[str, float]]:
    """(variant, dtype, batch) -> p50_ms, p95_ms, items_per_s of the network-alone CSV."""
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {(r["variant"], r["dtype"], int(r["batch"])): {k: float(r[k]) for k in ("p50_ms", "p95_ms",
                                                                                    "items_per_s")}
            for r in csv.DictReader(lines)}


def compare(measured: Path, alone: Path | None, gpu: str = "H200") -> list[dict[str, Any]]:
    """One record per measured whole-GPU row: modeled, served and alone figures and their ratios."""
    spec = replace(GPU_SPECS[gpu], whole=True)
    whole = spec.mig.profile("gpu")
    zoo = {v.name: v for v in variants()}
    by_alone = read_alone(alone) if alone is not None and alone.exists() else {}
    out = []
    for row in read_profile_csv(measured):
        if row.mig_profile != "gpu" or row.variant not in zoo:
            continue
        m = segment_row(zoo[row.variant], spec, whole, row.mps, row.batch)
        rec: dict[str, Any] = {
            "variant": row.variant, "mps": row.mps, "batch": row.batch,
            "modeled_items_s": m.throughput_rps, "modeled_p95_ms": m.latency_ms,
            "served_items_s": row.throughput_rps, "served_p95_ms": row.latency_ms,
            "served_over_modeled": row.throughput_rps / m.throughput_rps,
        }
        if row.mps == 1:  # the network alone ran as one process
            for dtype in ("float32", "float16"):
                a = by_alone.get((row.variant, dtype, row.batch))
                if a is not None:
                    rec[f"alone_{dtype}_items_s"] = a["items_per_s"]
            best = max((rec.get(f"alone_{d}_items_s", 0.0) for d in ("float32", "float16")), default=0.0)
            if best:
                rec["alone_over_modeled"] = best / m.throughput_rps
                rec["pipeline_efficiency"] = row.throughput_rps / best
        out.append(rec)
    return out


def _f(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def print_table(records: list[dict[str, Any]], gpu: str) -> None:
    print(f"modeled ({gpu} whole GPU, jigsaw modeled) against measured; items/s; p95 in ms")
    head = ("variant", "mps", "batch", "modeled", "served", "served/mod", "mod p95", "served p95",
            "alone fp32", "alone fp16", "alone/mod", "pipeline eff")
    rows = [(r["variant"], str(r["mps"]), str(r["batch"]), _f(r["modeled_items_s"]),
             _f(r["served_items_s"]), _f(r["served_over_modeled"], ".2f"), _f(r["modeled_p95_ms"], ".1f"),
             _f(r["served_p95_ms"], ".1f"), _f(r.get("alone_float32_items_s")),
             _f(r.get("alone_float16_items_s")), _f(r.get("alone_over_modeled"), ".2f"),
             _f(r.get("pipeline_efficiency"), ".2f"))
            for r in records]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    for line in (head, *rows):
        cells = enumerate(zip(line, widths, strict=True))
        print("  ".join(x.rjust(w) if k else x.ljust(w) for k, (x, w) in cells))
    for key, what in (("served_over_modeled", "served / modeled"), ("alone_over_modeled", "alone / modeled"),
                      ("pipeline_efficiency", "pipeline efficiency (served / alone)")):
        xs = [r[key] for r in records if key in r]
        if xs:
            geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
            print(f"{what}: geometric mean {geo:.2f} over {len(xs)} rows "
                  f"(min {min(xs):.2f}, max {max(xs):.2f})")
    print("the modeled rows assume:")
    for line in PIPELINE_ASSUMPTIONS:
        print(f"  - {line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=GPU_DATA,
                   help="the measured files' folder (default ../shared/data/gpu)")
    p.add_argument("--measured", type=Path, default=None,
                   help="measured pipeline rows (default: DATA/h200-pipeline-measured.csv)")
    p.add_argument("--alone", type=Path, default=None,
                   help="the network alone (default: DATA/h200-model-alone.csv)")
    p.add_argument("--gpu", default="H200", help=f"the modeled GPU ({', '.join(sorted(GPU_SPECS))})")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    args = p.parse_args(argv)
    measured = args.measured or args.data / "h200-pipeline-measured.csv"
    alone = args.alone or args.data / "h200-model-alone.csv"
    if not measured.exists():
        print(f"no measured rows at {measured} (give --data or --measured)", file=sys.stderr)
        return 2
    if args.gpu not in GPU_SPECS:
        print(f"--gpu: no modeled figures for {args.gpu!r} (known: {', '.join(sorted(GPU_SPECS))})",
              file=sys.stderr)
        return 2
    records = compare(measured, alone, args.gpu)
    if args.json:
        print(json.dumps({"gpu": args.gpu, "measured": str(measured), "alone": str(alone),
                          "assumptions": list(PIPELINE_ASSUMPTIONS), "rows": records}, indent=1))
    else:
        print_table(records, args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
