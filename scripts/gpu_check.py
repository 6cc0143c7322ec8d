"""``scripts/gpu-check``: one command that checks jigsaw on a machine with one GPU (see README.md).

Steps, each with a timeout; a step that fails says why and the next one runs; a summary table at
the end; exit status 1 when a check failed (a skipped step is not a failure):

1. ``doctor``: ``jigsaw doctor`` on a node of this GPU used whole (``mig = false``);
2. ``pipeline``: per variant kind the network alone beside the served pipeline at batch 1, 8, 32
   (``bench/gpu_pipeline.py --json``; skipped where this tree has no such bench);
3. ``profile``: ``jigsaw profile --backend torch`` at MPS 1, 2, 4 on the whole GPU (the rows go
   where the serving node reads its profiles), then those rows against the modeled ones;
4. ``serve-classifier``, ``serve-detector``: ``jigsawd`` serving a classifier app and a detector app
   with real models on the whole GPU, under load from ``bench/serve_load.py`` (the first 200
   requests after ready at concurrency 8: none may fail; then closed-loop load: answers/s, p50,
   p99), and the same app on the CPU (``CUDA_VISIBLE_DEVICES=""``, a CPU node) answering the same
   images: integers equal, floats within 0.02 + 1% (``serve_load.compare``).

It never changes MIG settings (``jigsaw doctor`` reads; a ``mig = false`` node creates no MIG
instance; ``jigsaw profile`` refuses a GPU with MIG devices). ``--device cpu`` runs the same steps
on this machine's CPU (a CPU node; no MPS), ``--quick`` with fewer variants, batches and seconds,
``--dry-run`` prints the steps and writes the node and app files without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

BUDGET_S = 470.0  # the whole run stays under 8 minutes
SERVE_RESERVE_S = 170.0  # kept for the two serving steps by the steps before them
CLASSIFY, DETECT = "gc_classify", "gc_detect"


@dataclass
class Step:
    name: str
    status: str = "skip"  # pass | FAIL | skip
    seconds: float = 0.0
    summary: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ctx:
    args: argparse.Namespace
    work: Path
    deadline: float
    env: dict[str, str]
    gpu: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.args.device == "cuda"

    def server_env(self) -> dict[str, str]:
        """What a server adds to the environment (its launcher sets PYTHONPATH to this tree)."""
        return {k: v for k, v in self.env.items() if k != "PYTHONPATH" and os.environ.get(k) != v}

    def left_s(self, want: float, reserve_s: float = 0.0) -> float:
        """A step's timeout: what it wants, within what is left of the whole run's budget less what
        the steps after it need (``reserve_s``)."""
        return max(5.0, min(want, self.deadline - time.monotonic() - reserve_s))

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
        """A command with a timeout; (exit status, its output); 124 when it ran out of time."""
        print(f"$ {' '.join(argv)}", flush=True)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s,
                                  env={**self.env, **(env or {})}, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            return 124, (out or "") + f"\n(timed out after {timeout_s:.0f} s)"
        return done.returncode, done.stdout + done.stderr


def jigsaw(*args: str) -> list[str]:
    return [sys.executable, "-m", "jigsaw.cli", *args]


# ---- the machine and the files --------------------------------------------------------------

GPU_PROBE = """
import json, torch
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no CUDA device (torch " + torch.__version__ + ")"}))
else:
    p = torch.cuda.get_device_properties(0)
    print(json.dumps({"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1),
                      "sm_count": p.multi_processor_count, "count": torch.cuda.device_count(),
                      "torch": torch.__version__, "cuda": torch.version.cuda}))
"""


def model_name(device_name: str, memory_gb: float) -> str:
    """The node file's model for a device: jigsaw's name where it has a table of it (its doctor
    then shows the driver's MIG profiles beside it), else the device's own name."""
    n = device_name.upper()
    if "H200" in n:
        return "H200"
    if "H100" in n and memory_gb > 70:
        return "H100-80GB"
    if "A100" in n:
        return "A100-80GB" if memory_gb > 45 else "A100-40GB"
    return re.sub(r"[^A-Za-z0-9.-]+", "-", device_name).strip("-") or "GPU"


def probe_gpu(ctx: Ctx) -> dict[str, Any]:
    if not ctx.cuda:
        return {"name": f"CPU ({os.cpu_count()} cores)", "cpu": True}
    code, out = ctx.run([sys.executable, "-c", GPU_PROBE], ctx.left_s(90))
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = {"error": f"probing the GPU failed (exit {code}): {out.strip()[-300:]}"}
    if "name" in info:
        info["model"] = model_name(info["name"], info["memory_gb"])
    return info


def variants(ctx: Ctx) -> dict[str, str]:
    """The classifier and the detector checked (smaller ones with --quick)."""
    return {"classifier": "efficientnet-b0", "detector": "yolov5n" if ctx.args.quick else "yolov5s"}


def batches(ctx: Ctx) -> list[int]:
    if not ctx.cuda:
        return [1, 2] if ctx.args.quick else [1, 4]
    return [1, 8] if ctx.args.quick else [1, 8, 32]


def mps_levels(ctx: Ctx) -> list[int]:
    return [1, 2, 4] if ctx.cuda else [1]


APP = """
name = "{name}"
latency_slo_ms = {slo}
[[inputs]]
name = "image"
datatype = "UINT8"
shape = [-1, -1, 3]
[[tasks]]
name = "{task}"
kind = "{kind}"
variants = [{{ name = "{variant}", accuracy = 50.0 }}]
"""


def write_files(ctx: Ctx) -> dict[str, Path]:
    """The apps, the node of this device (its profiles folder) and the CPU reference node."""
    v = variants(ctx)
    slo = 2000 if ctx.cuda else 10000
    paths = {"classify": ctx.work / "classify.toml", "detect": ctx.work / "detect.toml"}
    paths["classify"].write_text(APP.format(name=CLASSIFY, slo=slo, task="classify", kind="classifier",
                                            variant=v["classifier"]))
    paths["detect"].write_text(APP.format(name=DETECT, slo=slo, task="detect", kind="detector",
                                          variant=v["detector"]))
    if ctx.cuda:
        g = ctx.gpu
        gpus = (f'model = "{g.get("model", "GPU")}"\nmig = false\nmemory_gb = {g.get("memory_gb", 80)}\n'
                f'sm_count = {g.get("sm_count", 132)}')
    else:
        gpus = 'model = "CPU-2C"\nmig_profiles = ["2c"]'
    paths["node"] = ctx.work / "node.toml"
    paths["node"].write_text(_node("gpu-check", gpus, ctx.args.backend, mps_levels(ctx), batches(ctx),
                                   "profiles"))
    paths["reference"] = ctx.work / "reference.toml"
    paths["reference"].write_text(_node("gpu-check-cpu", 'model = "CPU-4C"\nmig_profiles = ["4c"]', "torch",
                                        [1], [1], "reference-profiles"))
    write_planning_rows(ctx.work / "reference-profiles", "4c", list(v.values()))
    return paths


def _node(name: str, gpus: str, backend: str, levels: list[int], sizes: list[int], profiles: str) -> str:
    return textwrap.dedent(f"""\
        name = "{name}"
        apps = ["classify.toml", "detect.toml"]
        [gpus]
        {{gpus}}
        count = 1
        mps_levels = {levels}
        batch_sizes = {sizes}
        profiles_dir = "{profiles}"
        backend = "{backend}"
        [planner]
        solver = "highs"
        [server]
        max_payload_bytes = 16777216
        ring_slot_bytes = 4194304
        """).replace("{gpus}", gpus)


def write_planning_rows(directory: Path, profile: str, names: list[str], batch_sizes: tuple[int, ...] = (1,),
                        only_missing: bool = False) -> None:
    """Rows that only let a node plan one instance per task (the CPU reference, or a device whose
    rows were not measured): 300 ms a batch, labelled as such, never measured."""
    from jigsaw.profiles import ProfileRow, write_profile_csv
    for n in names:
        path = directory / f"{n}.csv"
        if only_missing and path.exists():
            continue
        rows = [ProfileRow(n, profile, 1, b, 300.0, b / 0.3, 1500.0, "modeled", "gpu-check planning row",
                           "none", "") for b in batch_sizes]
        write_profile_csv(path, rows, "planning rows of scripts/gpu-check: not measured, not modeled")


# ---- the steps ------------------------------------------------------------------------------

def step_doctor(ctx: Ctx, files: dict[str, Path], step: Step) -> None:
    code, out = ctx.run(jigsaw("doctor", "--node-config", str(files["node"])), ctx.left_s(60))
    print(out.rstrip())
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    step.status = "pass" if code == 0 else "FAIL"
    step.summary = "every check ok" if code == 0 else (fails[0] if fails else f"exit {code}: {out[-200:]}")
    step.detail = {"exit": code, "warnings": [ln for ln in out.splitlines() if ln.startswith("warn")]}


def step_pipeline(ctx: Ctx, files: dict[str, Path], step: Step) -> None:
    """``bench/gpu_pipeline.py``: the network alone beside the served pipeline, per variant kind."""
    bench = ROOT / "bench" / "gpu_pipeline.py"
    if not bench.exists():
        step.summary = "bench/gpu_pipeline.py is not in this tree (issue 37, items 1-4): skipped"
        return
    out_json = ctx.work / "gpu_pipeline.json"
    argv = [sys.executable, str(bench), "--json", str(out_json), "--device", ctx.args.device,
            "--backend", ctx.args.backend, "--variants", ",".join(variants(ctx).values())]
    argv += ["--quick"] if ctx.args.quick else ["--batches", "1,8,32", "--seconds", "1"]
    code, out = ctx.run(argv, ctx.left_s(120, SERVE_RESERVE_S + 120))
    print(out.rstrip()[-3000:])
    doc = json.loads(out_json.read_text()) if out_json.exists() else _last_json(out)
    if code != 0 or doc is None:
        step.status, step.summary = "FAIL", f"exit {code}: {out.strip()[-300:]}"
        return
    rows = _records(doc)
    step.status, step.detail = "pass", {"rows": rows}
    top = max((int(r["batch"]) for r in rows if str(r.get("batch", "")).isdigit()), default=0)
    step.summary = f"{len(rows)} rows" + "".join(
        f"; {r.get('variant', r.get('kind', '?'))} b{top} served/alone {_efficiency(r):.2f}"
        for r in rows if str(r.get("batch")) == str(top) and _efficiency(r) is not None)


def _last_json(out: str) -> Any:
    """The JSON document a command printed (its output may carry log lines before it)."""
    for start in (m.start() for m in re.finditer(r"^[\[{]", out, re.M)):
        try:
            return json.loads(out[start:])
        except ValueError:
            continue
    return None


def _records(doc: Any) -> list[dict[str, Any]]:
    """The rows of a bench's JSON: a list of records, or the first list of records in an object."""
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, dict)]
    if isinstance(doc, dict):
        for value in doc.values():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                return value
    return []


def _efficiency(r: dict[str, Any]) -> float | None:
    """served / alone items/s of a record, whatever its keys call them."""
    def find(word: str) -> float | None:
        keys = [k for k in r if word in k.lower() and "item" in k.lower()]
        return float(r[keys[0]]) if keys and isinstance(r[keys[0]], int | float) else None
    if isinstance(r.get("efficiency"), int | float):
        return float(r["efficiency"])
    alone, served = find("alone"), find("served") or find("pipeline")
    return served / alone if alone and served is not None else None


def step_profile(ctx: Ctx, files: dict[str, Path], step: Step) -> None:
    v = variants(ctx)
    names = list(v.values()) if not ctx.args.quick or not ctx.cuda else [v["classifier"]]
    argv = jigsaw("profile", "--node", str(files["node"]), "--backend", ctx.args.backend,
                  "--variants", ",".join(names), "--batches", ",".join(map(str, batches(ctx))),
                  "--seconds", "0.5" if ctx.args.quick else "1",
                  "--max-iters", "5" if ctx.args.quick else "30")
    if ctx.cuda:  # the whole GPU at each MPS level (its MPS shares' rows are derived from them)
        argv += ["--segments", "gpu", "--mps-levels", ",".join(map(str, mps_levels(ctx)))]
    code, out = ctx.run(argv, ctx.left_s(180, SERVE_RESERVE_S))
    from jigsaw.profiles import read_profile_csv
    rows = [r for n in names if (ctx.work / "profiles" / f"{n}.csv").exists()
            for r in read_profile_csv(ctx.work / "profiles" / f"{n}.csv") if r.source == "measured"]
    for r in rows:
        print(f"  {r.variant:<16} {r.mig_profile}x{r.mps} b{r.batch:<3} p95 {r.latency_ms:8.2f} ms  "
              f"{r.throughput_rps:9.1f} items/s")
    step.detail = {"rows": [r.__dict__ for r in rows]}
    if code != 0:
        step.status, step.summary = "FAIL", f"exit {code}: {out.strip()[-300:]}"
        return
    step.status = "pass"
    step.summary = f"{len(rows)} rows measured at MPS {','.join(map(str, mps_levels(ctx)))}"
    if ctx.cuda and ctx.gpu.get("model") in _modeled_gpus():
        step.detail["modeled"] = compare_modeled(ctx, names)


def _modeled_gpus() -> set[str]:
    from jigsaw.modeled import GPU_SPECS
    return set(GPU_SPECS)


def compare_modeled(ctx: Ctx, names: list[str]) -> list[dict[str, Any]]:
    """The measured rows against the modeled rows of this GPU (bench/modeled_vs_measured.py)."""
    import modeled_vs_measured as mvm
    records = []
    for n in names:
        path = ctx.work / "profiles" / f"{n}.csv"
        if path.exists():
            records += mvm.compare(path, None, ctx.gpu["model"])
    if records:
        mvm.print_table(records, ctx.gpu["model"])
    return records


def serve_settings(ctx: Ctx, kind: str) -> dict[str, Any]:
    """Image size, planned demand (above what one GPU holds: the planner then plans the most it
    serves) and load of a serving step; a CPU's is small."""
    quick = ctx.args.quick
    size = 224 if kind == "classifier" else (640 if ctx.cuda else 320)
    if not ctx.cuda:
        return {"image_size": size, "demand": "100", "seconds": 3.0, "first": 8 if quick else 32,
                "first_concurrency": 2, "samples": 4 if quick else 8, "concurrency": 4}
    return {"image_size": size, "demand": "100000", "seconds": 5.0 if quick else 10.0, "first": 200,
            "first_concurrency": 8, "samples": 8 if quick else 16, "concurrency": 64}


def step_serve(ctx: Ctx, files: dict[str, Path], step: Step, app: str, kind: str) -> None:
    """The app on this device under load, then the same images on the CPU reference."""
    import serve_load
    import uvloop

    from jigsaw.testing import ServerError, jigsawd
    s = serve_settings(ctx, kind)
    images = [serve_load.binary_request(im) for im in serve_load.make_images(max(s["samples"], 8),
                                                                              s["image_size"])]
    args = ["--node-config", str(files["node"]), "--apps", app, "--demand", s["demand"], "--no-controller"]
    server = jigsawd(args, ctx.work / f"{app}.log", emulate=False, ready_timeout_s=ctx.left_s(150),
                     env=ctx.server_env())
    report: dict[str, Any] = {"app": app, "image_size": s["image_size"]}
    try:
        server.start()
        infer = f"{server.url}/v2/models/{app}/infer"
        report["startup_s"] = round(server.startup_s, 1)
        first = uvloop.run(serve_load.run_phase(infer, images, s["first_concurrency"], count=s["first"]))
        report["first"] = {**first.summary(), "concurrency": s["first_concurrency"]}
        load = uvloop.run(serve_load.run_phase(infer, images, s["concurrency"], seconds=s["seconds"]))
        report["load"] = {**load.summary(), "concurrency": s["concurrency"]}
        got = uvloop.run(serve_load.collect_answers(infer, images[:s["samples"]]))
    except ServerError as exc:
        step.status, step.summary = "FAIL", f"jigsawd did not serve: {str(exc).splitlines()[0]}"
        step.detail = {"log": server.log()[-2000:]}
        print(server.log()[-2000:])
        return
    finally:
        server.close()
    report["answers"] = reference_answers(ctx, files, app, images[:s["samples"]], got)
    serve_load.print_report(report)
    failed = serve_load.failed_checks(report, ctx.args.min_match)
    step.detail = report
    step.status = "FAIL" if failed else "pass"
    ld = report["load"]
    step.summary = "; ".join(failed) if failed else (
        f"{ld['answers_per_s']:.{0 if ld['answers_per_s'] >= 10 else 2}f} req/s x{ld['concurrency']}, "
        f"p50 {ld['p50_ms']:.1f} ms, "
        f"p99 {ld['p99_ms']:.1f} ms, first {report['first']['sent']}: 0 failed, answers "
        f"{report['answers']['matched']}/{report['answers']['samples']} as the CPU's")


def reference_answers(ctx: Ctx, files: dict[str, Path], app: str, images: list[Any], got: list[Any]
                      ) -> dict[str, Any]:
    """The same images answered by the app on the CPU (a CPU node, no GPU visible), compared."""
    import serve_load
    import uvloop

    from jigsaw.testing import ServerError, jigsawd
    args = ["--node-config", str(files["reference"]), "--apps", app, "--demand", "0.5", "--no-controller"]
    ref_server = jigsawd(args, ctx.work / f"{app}-cpu.log", emulate=False, ready_timeout_s=ctx.left_s(120),
                         env={**ctx.server_env(), "CUDA_VISIBLE_DEVICES": ""})
    try:
        ref_server.start()
        ref = uvloop.run(serve_load.collect_answers(f"{ref_server.url}/v2/models/{app}/infer", images))
    except ServerError as exc:
        ref = [None] * len(images)
        print(f"the CPU reference did not serve: {str(exc).splitlines()[0]}")
    finally:
        ref_server.close()
    return serve_load.compare(got, ref)


# ---- the run --------------------------------------------------------------------------------

def prepare_profiles(ctx: Ctx, files: dict[str, Path]) -> None:
    """Rows the serving node plans with before any is measured: modeled for a GPU jigsaw models,
    else planning rows; the profile step's measured rows replace them."""
    names = list(variants(ctx).values())
    if ctx.cuda:
        code, out = ctx.run(jigsaw("modeled", "--node", str(files["node"])), ctx.left_s(60))
        if code == 0:
            return
        print(f"no modeled rows for this GPU ({out.strip()[-200:]}): planning rows instead")
    write_planning_rows(ctx.work / "profiles", "gpu" if ctx.cuda else "2c", names, tuple(batches(ctx)),
                        only_missing=True)


def plan_steps(ctx: Ctx, files: dict[str, Path]) -> list[tuple[str, Callable[[Step], None]]]:
    steps: list[tuple[str, Callable[[Step], None]]] = [
        ("doctor", lambda s: step_doctor(ctx, files, s)),
        ("pipeline", lambda s: step_pipeline(ctx, files, s)),
        ("profile", lambda s: step_profile(ctx, files, s)),
        ("serve-classifier", lambda s: step_serve(ctx, files, s, CLASSIFY, "classifier")),
        ("serve-detector", lambda s: step_serve(ctx, files, s, DETECT, "detector")),
    ]
    only = {x for x in ctx.args.only.split(",") if x} if ctx.args.only else None
    return [(n, f) for n, f in steps if only is None or n in only]


def run_steps(ctx: Ctx, steps: list[tuple[str, Callable[[Step], None]]]) -> list[Step]:
    results = []
    for name, fn in steps:
        step = Step(name)
        print(f"\n== {name} ==", flush=True)
        t0 = time.monotonic()
        if time.monotonic() > ctx.deadline:
            step.summary = f"skipped: the run's {ctx.args.budget_s:.0f} s budget is spent"
        else:
            try:
                fn(step)
            except Exception as exc:  # a step that breaks says why; the next one runs
                step.status, step.summary = "FAIL", f"{type(exc).__name__}: {exc}"
        step.seconds = time.monotonic() - t0
        print(f"-> {step.status}: {step.summary}", flush=True)
        results.append(step)
    return results


def print_summary(ctx: Ctx, results: list[Step], total_s: float) -> None:
    print(f"\n== summary ({ctx.gpu.get('name', '?')}, --device {ctx.args.device}"
          f"{', --quick' if ctx.args.quick else ''}, {total_s:.0f} s; files in {ctx.work}) ==")
    width = max(len(r.name) for r in results) if results else 8
    for r in results:
        print(f"{r.name:<{width}}  {r.status:<4}  {r.seconds:6.1f} s  {r.summary}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--backend", default="torch", help="the backend the node serves with (torch)")
    p.add_argument("--quick", action="store_true", help="fewer variants, batches, requests and seconds")
    p.add_argument("--only", default="", help="comma-separated steps (doctor,pipeline,profile,"
                                              "serve-classifier,serve-detector)")
    p.add_argument("--out", type=Path, default=None, help="work folder (default out/gpu-check/<time>)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole run's time budget (470 s)")
    p.add_argument("--min-match", type=float, default=0.95,
                   help="share of the sample answers that must match the CPU's (0.95)")
    p.add_argument("--dry-run", action="store_true", help="write the files, print the steps, run nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    work = args.out or ROOT / "out" / "gpu-check" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                     os.environ.get("PYTHONPATH")])))
    if args.device == "cpu":  # the CPU node's image sizes (examples/cpu.toml's)
        env |= {"JIGSAW_DETECTOR_SIZE": "320", "JIGSAW_CLASSIFIER_SIZE": "96"}
    ctx = Ctx(args, work.resolve(), t0 + args.budget_s, env)
    ctx.gpu = {"name": "(not probed: --dry-run)"} if args.dry_run else probe_gpu(ctx)
    if "error" in ctx.gpu:
        print(f"FAIL gpu: {ctx.gpu['error']}")
        return 1
    files = write_files(ctx)
    steps = plan_steps(ctx, files)
    if args.dry_run:
        from jigsaw.node import load_node
        for key in ("node", "reference"):
            node = load_node(files[key])
            print(f"{files[key].name}: {node.num_gpus} x {node.gpu.name} ({', '.join(node.mig_profiles)}), "
                  f"backend {node.backend}, apps {', '.join(a.name for a in node.apps)}")
        print(f"would run in {ctx.work} (files written: {', '.join(p.name for p in files.values())}):")
        for name, _ in steps:
            print(f"  {name}")
        return 0
    prepare_profiles(ctx, files)
    results = run_steps(ctx, steps)
    print_summary(ctx, results, time.monotonic() - t0)
    (ctx.work / "summary.json").write_text(json.dumps(
        {"gpu": ctx.gpu, "args": {k: str(v) for k, v in vars(args).items()},
         "steps": [r.__dict__ for r in results]}, indent=1, default=str))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
