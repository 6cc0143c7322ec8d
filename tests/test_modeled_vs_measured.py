"""``jigsaw modeled`` says what its rows assume about the pipeline, and
``bench/modeled_vs_measured.py`` prints modeled rows against measured ones with ratios (the real
H200's rows in ``../shared/data/gpu/`` where present; a small measured file otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import modeled_vs_measured as bench  # noqa: E402

from jigsaw.modeled import PIPELINE_ASSUMPTIONS, main  # noqa: E402

MEASURED = """\
# a measured whole-GPU file as jigsaw profile writes it
variant,mig_profile,mps,batch,latency_ms,throughput_rps,memory_mb,source,host,backend,date
efficientnet-b0,gpu,1,32,40.0,800.0,1066.5,measured,h,torch,2026-11-28
vgg11,gpu,2,8,9.0,1800.0,2303.5,measured,h,torch,2026-11-28
resnet50,1g.18gb,1,8,9.0,900.0,1000.0,measured,h,torch,2026-11-28
"""
ALONE = """\
# the network alone
variant,dtype,batch,p50_ms,p95_ms,items_per_s
efficientnet-b0,float32,32,4.8,6.4,6400.0
efficientnet-b0,float16,32,9.2,9.6,3200.0
"""


def test_modeled_says_its_assumptions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpu", "H200", "--whole", "--variants", "vgg11", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the rows assume" in out and all(line in out for line in PIPELINE_ASSUMPTIONS)
    assert any("pre-processing" in line and "not included" in line for line in PIPELINE_ASSUMPTIONS)


def test_the_bench_puts_modeled_rows_beside_measured_ones(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.csv").write_text(MEASURED)
    (tmp_path / "a.csv").write_text(ALONE)
    rows = bench.compare(tmp_path / "m.csv", tmp_path / "a.csv", "H200")
    keys = [(r["variant"], r["mps"], r["batch"]) for r in rows]
    assert keys == [("efficientnet-b0", 1, 32), ("vgg11", 2, 8)]  # the MIG row is not a whole GPU's
    eff = rows[0]
    assert eff["modeled_items_s"] == pytest.approx(4216, rel=0.01)  # the modeled H200 figure
    assert eff["served_over_modeled"] == pytest.approx(800 / eff["modeled_items_s"])
    assert eff["pipeline_efficiency"] == pytest.approx(800 / 6400)  # against the best dtype
    assert "pipeline_efficiency" not in rows[1]  # the network alone ran as one process only
    assert bench.main(["--measured", str(tmp_path / "m.csv"), "--alone", str(tmp_path / "a.csv")]) == 0
    out = capsys.readouterr().out
    assert "served / modeled" in out and "the modeled rows assume" in out
    assert bench.main(["--measured", str(tmp_path / "absent.csv")]) == 2


@pytest.mark.skipif(not (bench.GPU_DATA / "h200-pipeline-measured.csv").exists(),
                    reason=f"the H200 measurements are not at {bench.GPU_DATA}")
def test_the_real_h200_rows() -> None:
    rows = {(r["variant"], r["mps"], r["batch"]): r for r in bench.compare(
        bench.GPU_DATA / "h200-pipeline-measured.csv", bench.GPU_DATA / "h200-model-alone.csv")}
    assert len(rows) == 18
    assert rows[("vgg11", 1, 32)]["modeled_items_s"] == pytest.approx(4880, rel=0.01)
    assert rows[("efficientnet-b0", 1, 32)]["pipeline_efficiency"] == pytest.approx(831.444 / 6692.0)
