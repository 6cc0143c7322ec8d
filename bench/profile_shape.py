"""Checks the batch-scaling shape of the modeled profiles against Loki's measured runtimes.

Our rows are modeled (profiles/generate.py) for an H100; Loki's are p95 runtimes measured with
onnxruntime on an Ampere GPU. Absolute times are not comparable, so only the shape is: for each
variant in both, latency(b) / latency(1) of our 7g.80gb MPS-1 rows against the measured ratio,
and the per-item ratio (latency(b) / b) / latency(1).

    python bench/profile_shape.py [--profiles profiles/h100-80gb] [--loki PATH]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    from jigsaw.profiles import load_profiles
except ImportError:  # run from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))
    from jigsaw.profiles import load_profiles

DEFAULT_LOKI = Path(__file__).resolve().parents[2] / "shared/data/loki/simulator_runtimes.csv"
ACCEL = "onnxruntime_gpu_ampere"
# Loki's names for the same networks; genderNet_NN is its VGG-NN based age/gender classifier.
ALIASES = {f"genderNet_{n}": f"vgg{n}" for n in (11, 13, 16, 19)}
# Ultralytics YOLOv5 README (v7.0): V100, PyTorch FP16, ms per image at batch 1 and at batch 32.
ULTRALYTICS_V100 = {"yolov5n": (6.3, 0.6), "yolov5s": (6.4, 0.9), "yolov5m": (8.2, 1.7),
                    "yolov5l": (10.1, 2.7), "yolov5x": (12.1, 4.8)}


def read_loki(path: Path, accel: str = ACCEL) -> dict[str, dict[int, float]]:
    """p95 runtime (ms) per (model, batch) for one accelerator of Loki's runtime table."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["Accel"] != accel:
                continue
            name = ALIASES.get(row["Model"], row["Model"])
            out[name][int(row["batchsize"])] = float(row["95th_pct"])
    return dict(out)


def family(variant: str) -> str:
    for prefix in ("efficientnet", "yolov5", "resnet", "vgg", "git"):
        if variant.startswith(prefix):
            return prefix
    return variant


def compare(profiles_dir: Path, loki: dict[str, dict[int, float]], profile: str = "7g.80gb"
            ) -> list[tuple[str, int, float, float]]:
    """(variant, batch, modeled latency ratio, measured latency ratio) for shared variants."""
    table = load_profiles(profiles_dir)
    rows = []
    for variant in sorted(table.variants & loki.keys()):
        measured = loki[variant]
        ours = {r.batch: r.latency_ms for r in table.rows(variant) if r.mig_profile == profile
                and r.mps == 1}
        if 1 not in ours or 1 not in measured:
            continue
        for b in sorted(ours.keys() & measured.keys()):
            if b > 1:
                rows.append((variant, b, ours[b] / ours[1], measured[b] / measured[1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", type=Path, default=ROOT / "profiles" / "h100-80gb")
    parser.add_argument("--loki", type=Path, default=DEFAULT_LOKI)
    args = parser.parse_args(argv)
    if not args.loki.is_file():
        print(f"Loki runtime table not found at {args.loki}; nothing to compare.")
        return 0
    rows = compare(args.profiles, read_loki(args.loki))
    print("Batch-scaling shape: OUR numbers are MODELED (H100 7g.80gb, MPS 1, p95);")
    print(f"Loki's are MEASURED p95 with onnxruntime on an Ampere GPU ({ACCEL}).")
    print("ratio = latency(b) / latency(1); per-item = ratio / b; dev = modeled / measured.\n")
    print(f"{'variant':16} {'batch':>5} {'modeled':>8} {'measured':>9} {'dev':>6} "
          f"{'item(mod)':>10} {'item(meas)':>10}")
    by_family: dict[str, list[float]] = defaultdict(list)
    for variant, b, mod, meas in rows:
        dev = mod / meas
        by_family[family(variant)].append(dev)
        print(f"{variant:16} {b:5d} {mod:8.2f} {meas:9.2f} {dev:6.2f} {mod / b:10.3f} {meas / b:10.3f}")
    print("\nsummary per family (dev = modeled/measured ratio of latency(b)/latency(1)):")
    print(f"{'family':14} {'points':>6} {'geo-mean dev':>13} {'max |log2 dev|':>15} {'worst':>7}")
    for fam, devs in sorted(by_family.items()):
        geo = math.exp(sum(math.log(d) for d in devs) / len(devs))
        worst = max(devs, key=lambda d: abs(math.log(d)))
        print(f"{fam:14} {len(devs):6d} {geo:13.2f} {abs(math.log2(worst)):15.2f} {worst:7.2f}")
    if not rows:
        print("(no variant in common)")
    table = load_profiles(args.profiles)
    print("\nsecond reference: Ultralytics' published V100 PyTorch FP16 speeds (measured, V100):")
    print(f"{'variant':10} {'L(32)/L(1) modeled H100':>24} {'published V100':>15}")
    for variant, (b1, b32_per_image) in ULTRALYTICS_V100.items():
        one, many = table.get(variant, "7g.80gb", 1, 1), table.get(variant, "7g.80gb", 1, 32)
        if one and many:
            print(f"{variant:10} {many.latency_ms / one.latency_ms:24.2f} {32 * b32_per_image / b1:15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
