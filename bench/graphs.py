"""The captioner and TTS as ONNX graphs under onnxruntime vs transformers itself (torch), on the CPU.

For each variant: one batch of ``--batch`` random inputs, timed ``--repeats`` times after a
warm-up, with ``--threads`` intra-op threads on both sides. The torch side is what the torch
backend runs (``generate`` with its KV cache; ``VitsModel`` item by item); the onnxruntime side is
what the onnxruntime backend runs (the graphs and their numpy driver). Prints median ms per
batch, the speed-up, and how the outputs agree: identical tokens for GIT (greedy on the same
weights), and for VITS the max abs error of each graph against torch at export time (its
sampling noise differs between the two sides, so waveforms are not compared sample by sample).
Models are randomly initialised; CPU timings of this machine only.

    PYTHONPATH=src python bench/graphs.py [--variants git-base,glow-tts,vits] [--batch 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="git-base,glow-tts,vits")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("JIGSAW_ONNX_CACHE", tempfile.mkdtemp(prefix="jigsaw-bench-onnx-"))
    import numpy as np
    import torch

    from jigsaw.models.export import driver, export, sample_input
    from jigsaw.models.graphs import ort_runner
    from jigsaw.models.text import caption, speak
    from jigsaw.models.zoo import build, model_config, variant_info
    torch.set_num_threads(args.threads)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"batch {args.batch}, {args.threads} threads, median of {args.repeats}")
    print(f"{'variant':10} {'export_s':>8} {'graph_err':>9} {'torch_ms':>9} {'ort_ms':>8} {'speedup':>7}  "
          "agreement")
    for variant in args.variants.split(","):
        ex = export(variant, force=True)
        model = build(variant)
        runners = {g: ort_runner(p, args.threads) for g, p in ex.graphs.items()}
        ort = driver(variant, model_config(variant), runners)
        batch = sample_input(variant, args.batch, seed=1)
        if variant_info(variant).kind == "captioner":
            def ref(b=batch, m=model):  # type: ignore[no-untyped-def]
                return caption(m, torch.from_numpy(b)).numpy()
            agree = f"tokens equal: {bool(np.array_equal(ref(), ort(batch)))}"
        else:
            def ref(b=batch, m=model):  # type: ignore[no-untyped-def]
                return speak(m, torch.from_numpy(b))
            lengths = [w.size for w in ort(batch)]
            agree = f"samples per item {min(lengths)}..{max(lengths)}"
        torch_ms = _median_ms(ref, args.repeats)
        ort_ms = _median_ms(lambda b=batch, run=ort: run(b), args.repeats)
        print(f"{variant:10} {ex.seconds:8.1f} {ex.max_abs_error:9.2g} {torch_ms:9.1f} {ort_ms:8.1f} "
              f"{torch_ms / ort_ms:6.2f}x  {agree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
