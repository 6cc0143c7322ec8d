"""Load a serving app with images and check what it answers: the load generator of `scripts/gpu-check`.

Against a running `jigsawd` (`--url`) and one of its apps (`--app`, an app whose input is an image,
`UINT8 [H, W, 3]`), sent as Triton's binary tensor extension (the image's raw bytes after the JSON
header, no base64, no JSON arrays):

1. **first requests after ready**: the first `--first` requests (200) at concurrency
   `--first-concurrency` (8), each counted by status: any answer but 200 is a failure;
2. **load**: `--concurrency` closed-loop clients for `--seconds`: answers per second, p50 and p99
   of the 200s, every status counted (503: shed above the plan's capacity; 504: dropped by deadline;
   0: no HTTP answer);
3. **answers against a reference** (`--reference-url`, e.g. the same app served on the CPU): the same
   `--samples` images to both, one at a time; integer outputs must be equal and float outputs
   within `atol + rtol x |reference|` (0.02 + 1%: scores in [0, 1], boxes in pixels), the same
   shapes; `--min-match` (0.95) of the answers must match.

    python bench/serve_load.py --url http://127.0.0.1:8000 --app classify [--image-size 224] \\
        [--reference-url URL] [--seconds 10] [--concurrency 8] [--json]

Exit status 1 when a check failed. The images are seeded noise with smooth structure, the same for
every run; the client runs in this process (uvloop) and shares the machine with the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
ATOL = 0.02
RTOL = 0.01


def make_images(count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` seeded (size, size, 3) uint8 images: smooth colour fields plus noise and a few
    rectangles, so a detector and a classifier see some structure."""
    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for _ in range(count):
        base = np.stack([128 + 100 * np.sin(2 * np.pi * (a * xx + b * yy + c))
                         for a, b, c in rng.uniform(0, 3, (3, 3))], axis=-1)
        img = base + rng.normal(0, 12, base.shape)
        for _ in range(3):
            x0, y0 = rng.integers(0, size * 3 // 4, 2)
            w, h = rng.integers(size // 8, size // 3, 2)
            img[y0:y0 + h, x0:x0 + w] = rng.uniform(0, 255, 3)
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def binary_request(image: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """The image as an OIP request with the binary tensor extension (outputs come back as JSON)."""
    raw = np.ascontiguousarray(image, np.uint8).tobytes()
    header = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": list(image.shape),
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return header + raw, {HEADER_LENGTH: str(len(header)), "Content-Type": "application/octet-stream"}


@dataclass
class PhaseResult:
    """What one phase got: statuses, the latencies of the 200s, the phase's wall time."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def failures(self) -> int:
        return self.sent - self.statuses.get(200, 0)

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.latencies_ms) if self.latencies_ms else np.array([np.nan])
        return {"sent": self.sent, "ok": self.statuses.get(200, 0), "failures": self.failures,
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "answers_per_s": self.statuses.get(200, 0) / self.seconds if self.seconds else 0.0,
                "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                "seconds": self.seconds}


async def _post(session: aiohttp.ClientSession, url: str, body: tuple[bytes, dict[str, str]]
                ) -> tuple[int, float, Any]:
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body[0], headers=body[1]) as r:
            raw = await r.read()
            status = r.status
    except (TimeoutError, aiohttp.ClientError):
        return 0, (time.perf_counter() - t0) * 1e3, None
    ms = (time.perf_counter() - t0) * 1e3
    doc = None
    if status == 200:
        try:
            doc = json.loads(raw)
        except ValueError:
            status = -2  # a 200 whose body is not JSON: counted as a failure
    return status, ms, doc


async def run_phase(url: str, bodies: list[tuple[bytes, dict[str, str]]], concurrency: int, *,
                    count: int | None = None, seconds: float | None = None,
                    timeout_s: float = 60.0) -> PhaseResult:
    """``concurrency`` closed-loop clients cycling over ``bodies`` until ``count`` requests were
    sent or ``seconds`` passed (whichever is given; both bound it)."""
    result = PhaseResult()
    sent = 0
    end = time.perf_counter() + (seconds if seconds is not None else 3600.0)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:

        async def client() -> None:
            nonlocal sent
            while time.perf_counter() < end and (count is None or sent < count):
                body = bodies[sent % len(bodies)]
                sent += 1
                status, ms, _ = await _post(s, url, body)
                result.statuses[status] += 1
                if status == 200:
                    result.latencies_ms.append(ms)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - t0
    return result


async def collect_answers(url: str, bodies: list[tuple[bytes, dict[str, str]]],
                          timeout_s: float = 120.0) -> list[dict[str, np.ndarray] | None]:
    """Each body's outputs (name -> array), one request at a time; None where it was not a 200."""
    out: list[dict[str, np.ndarray] | None] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        for body in bodies:
            status, _, doc = await _post(s, url, body)
            out.append(None if status != 200 or doc is None else {
                o["name"]: np.asarray(o.get("data", []), dtype=np.float64).reshape(o["shape"])
                for o in doc.get("outputs", [])})
    return out


def same_answer(got: dict[str, np.ndarray] | None, ref: dict[str, np.ndarray] | None,
                integers: set[str], atol: float = ATOL, rtol: float = RTOL) -> str:
    """"" when ``got`` matches ``ref`` (integer outputs equal, float outputs within atol + rtol x
    |ref|, the same names and shapes), else why not. Names are the response's, ``<task>.<output>``;
    ``integers`` names the outputs (their last part) compared exactly."""
    if got is None or ref is None:
        return "no answer" if got is None else "no reference answer"
    if set(got) != set(ref):
        return f"outputs {sorted(got)} vs {sorted(ref)}"
    for name, r in ref.items():
        g = got[name]
        if g.shape != r.shape:
            return f"{name}: shape {list(g.shape)} vs {list(r.shape)}"
        if name.rsplit(".", 1)[-1] in integers:
            if not np.array_equal(g, r):
                return f"{name}: {g.ravel()[:4].tolist()} vs {r.ravel()[:4].tolist()}"
        elif g.size and not np.all(np.abs(g - r) <= atol + rtol * np.abs(r)):
            return f"{name}: max difference {float(np.max(np.abs(g - r))):.4g}"
    return ""


INTEGER_OUTPUTS = {"label", "labels", "num_boxes", "tokens", "audio_samples"}


def compare(got: list[dict[str, np.ndarray] | None], ref: list[dict[str, np.ndarray] | None],
            atol: float = ATOL, rtol: float = RTOL) -> dict[str, Any]:
    """How many answers match the reference, and why the first few did not."""
    integers = INTEGER_OUTPUTS | {n.rsplit(".", 1)[-1] for r in ref if r for n in r
                                  if n.rsplit(".", 1)[-1].startswith("num_")}
    why = [same_answer(g, r, integers, atol, rtol) for g, r in zip(got, ref, strict=True)]
    matched = sum(1 for w in why if not w)
    values = sum(int(a.size) for r in ref if r for a in r.values())  # what was compared
    return {"samples": len(why), "matched": matched, "fraction": matched / len(why) if why else 0.0,
            "values": values, "atol": atol, "rtol": rtol, "mismatches": [w for w in why if w][:5]}


async def check(url: str, app: str, *, image_size: int = 224, first: int = 200, first_concurrency: int = 8,
                concurrency: int = 8, seconds: float = 10.0, samples: int = 16,
                reference_url: str | None = None, seed: int = 0) -> dict[str, Any]:
    """The three phases against ``url``'s ``app`` (and ``reference_url``'s, when given)."""
    infer = f"{url.rstrip('/')}/v2/models/{app}/infer"
    bodies = [binary_request(im) for im in make_images(max(samples, 8), image_size, seed)]
    report: dict[str, Any] = {"app": app, "url": url, "image_size": image_size}
    report["first"] = (await run_phase(infer, bodies, first_concurrency, count=first)).summary()
    report["load"] = (await run_phase(infer, bodies, concurrency, seconds=seconds)).summary()
    report["load"]["concurrency"] = concurrency
    if reference_url:
        ref_infer = f"{reference_url.rstrip('/')}/v2/models/{app}/infer"
        got = await collect_answers(infer, bodies[:samples])
        ref = await collect_answers(ref_infer, bodies[:samples])
        report["answers"] = compare(got, ref)
    return report


def failed_checks(report: dict[str, Any], min_match: float = 0.95) -> list[str]:
    """What failed: a failure among the first requests, no answer under load, answers that differ."""
    out = []
    if report["first"]["failures"]:
        out.append(f"{report['first']['failures']} of the first {report['first']['sent']} requests after "
                   f"ready failed ({report['first']['statuses']})")
    if not report["load"]["ok"]:
        out.append(f"no request answered under load ({report['load']['statuses']})")
    ans = report.get("answers")
    if ans is not None and ans["fraction"] < min_match:
        out.append(f"{ans['matched']} of {ans['samples']} answers match the reference "
                   f"(need {min_match:.0%}): {'; '.join(ans['mismatches'][:2])}")
    return out


def print_report(report: dict[str, Any]) -> None:
    f, ld = report["first"], report["load"]
    print(f"{report['app']}: first {f['sent']} after ready: {f['ok']} ok, {f['failures']} failed "
          f"{f['statuses']}")
    print(f"{report['app']}: load x{ld['concurrency']} {ld['seconds']:.1f} s: "
          f"{ld['answers_per_s']:.1f} answers/s, "
          f"p50 {ld['p50_ms']:.1f} ms, p99 {ld['p99_ms']:.1f} ms, statuses {ld['statuses']}")
    if "answers" in report:
        a = report["answers"]
        example = f"; e.g. {a['mismatches'][0]}" if a["mismatches"] else ""
        print(f"{report['app']}: answers vs reference: {a['matched']}/{a['samples']} within "
              f"{a['atol']} + {a['rtol']:.0%} (integers equal; {a['values']} values){example}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--app", required=True, help="an app whose input is an image")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--first", type=int, default=200, help="requests right after ready (200)")
    p.add_argument("--first-concurrency", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--samples", type=int, default=16, help="images compared with the reference")
    p.add_argument("--reference-url", default=None, help="the same app served elsewhere (the CPU path)")
    p.add_argument("--min-match", type=float, default=0.95)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    import uvloop
    report = uvloop.run(check(args.url, args.app, image_size=args.image_size, first=args.first,
                              first_concurrency=args.first_concurrency, concurrency=args.concurrency,
                              seconds=args.seconds, samples=args.samples, reference_url=args.reference_url))
    report["failed"] = failed_checks(report, args.min_match)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
        for why in report["failed"]:
            print(f"FAIL {why}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
