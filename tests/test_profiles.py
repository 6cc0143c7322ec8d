"""The modeled profiles: reproducible, complete, shaped as the model promises; the loader's errors."""

from __future__ import annotations

import importlib.util
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from jigsaw.errors import ConfigError
from jigsaw.mig import GPU_MODELS
from jigsaw.profiles import COLUMNS, load_profiles, read_profile_csv

ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = ROOT / "profiles" / "h100-80gb"
H100 = GPU_MODELS["H100-80GB"]
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
APP_VARIANTS = {
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "git-base", "git-large",
    "yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x", "vgg11", "vgg13", "vgg16", "vgg19",
    "glow-tts", "vits", *(f"efficientnet-b{i}" for i in range(8)),
}


def _load_generator():
    spec = importlib.util.spec_from_file_location("profiles_generate", ROOT / "profiles" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


@pytest.fixture(scope="module")
def table():
    return load_profiles(PROFILE_DIR)


def test_generator_is_deterministic():
    assert gen.generate("H100-80GB") == gen.generate("H100-80GB")


def test_committed_csvs_equal_a_fresh_generation(tmp_path):
    written = gen.write("H100-80GB", tmp_path)
    committed = sorted(p.name for p in PROFILE_DIR.glob("*.csv"))
    assert committed == sorted(p.name for p in written)
    for path in written:
        assert path.read_bytes() == (PROFILE_DIR / path.name).read_bytes(), (
            f"{path.name} differs from a fresh run: regenerate with python profiles/generate.py")


def test_other_gpu_models_can_be_generated():
    for name in gen.GPU_SPECS:
        rows = gen.generate(name)
        profiles = {r.mig_profile for r in rows["resnet50"]}
        assert profiles == set(GPU_MODELS[name].profile_names)


def test_every_variant_segment_and_batch_is_present(table):
    assert table.variants == APP_VARIANTS
    assert len(table) == len(APP_VARIANTS) * len(H100.profiles) * 4 * len(BATCHES)
    for v in APP_VARIANTS:
        for p in H100.profile_names:
            for k in (1, 2, 3, 4):
                for b in BATCHES:
                    assert table.get(v, p, k, b) is not None, (v, p, k, b)


def test_rows_are_labelled_modeled(table):
    assert table.sources == {"modeled"}
    for r in table.rows():
        assert r.host.startswith("model:") and r.backend == "modeled-h100" and r.date == gen.MODEL_DATE


def test_latency_grows_with_batch(table):
    for v in APP_VARIANTS:
        for p in H100.profile_names:
            for k in (1, 2, 3, 4):
                lat = [table.get(v, p, k, b).latency_ms for b in BATCHES]
                assert all(a < b for a, b in pairwise(lat)), (v, p, k, lat)


def test_throughput_does_not_fall_from_batch_1_to_8(table):
    for v in APP_VARIANTS:
        for p in H100.profile_names:
            for k in (1, 2, 3, 4):
                tput = [table.get(v, p, k, b).throughput_rps for b in (1, 2, 4, 8)]
                assert all(a <= b for a, b in pairwise(tput)), (v, p, k, tput)


def test_bigger_slice_is_never_slower(table):
    profs = H100.profiles
    for small in profs:
        for big in profs:
            if big is small or big.sm_count < small.sm_count or big.size < small.size:
                continue
            for v in APP_VARIANTS:
                for k in (1, 2, 3, 4):
                    for b in BATCHES:
                        lo = table.get(v, big.name, k, b).latency_ms
                        hi = table.get(v, small.name, k, b).latency_ms
                        assert lo <= hi, (v, small.name, big.name, k, b)


def test_mps_fills_a_slice_at_small_batch_but_not_at_large(table):
    for v in ("resnet50", "efficientnet-b0", "git-base", "yolov5n"):
        one = table.get(v, "1g.10gb", 1, 1).throughput_rps
        four = table.get(v, "1g.10gb", 4, 1).throughput_rps
        assert four > 2 * one, v
    for v in ("yolov5x", "vits", "efficientnet-b7"):
        one = table.get(v, "1g.10gb", 1, 128).throughput_rps
        four = table.get(v, "1g.10gb", 4, 128).throughput_rps
        assert four < 1.1 * one, v


def test_small_batch_on_a_small_slice_is_not_proportionally_slower(table):
    for v in APP_VARIANTS:
        ratio = table.get(v, "1g.10gb", 1, 1).latency_ms / table.get(v, "7g.80gb", 1, 1).latency_ms
        assert 1.0 <= ratio < 132 / 16, (v, ratio)


def test_anchor_latencies_are_plausible_for_an_h100(table):
    def lat(v, b=1):
        return table.get(v, "7g.80gb", 1, b).latency_ms

    assert 10 <= lat("yolov5x") <= 15
    assert 2 <= lat("resnet50") <= 4
    assert lat("git-large") < 300
    # The apps' paths fit their SLOs (2 x latency per task) with room for batching.
    assert 2 * (lat("yolov5x", 32) + lat("efficientnet-b7", 32)) < 650
    assert 2 * (lat("yolov5x", 8) + lat("git-large", 8) + lat("vits", 8)) < 1550


def test_some_rows_exceed_the_slice_memory(table):
    over = [r for r in table.rows() if r.mps * r.memory_mb > H100.profile(r.mig_profile).memory_gb * 1024]
    assert over and len(over) < len(table) // 2


# --- loader errors -----------------------------------------------------------------------------

GOOD_ROW = "resnet50,1g.10gb,1,1,4.1,258.3,574.6,modeled,model:test,modeled-h100,2026-11-22"


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loader_reads_a_good_file(tmp_path):
    rows = read_profile_csv(_write(tmp_path, ["# comment", ",".join(COLUMNS), GOOD_ROW]))
    assert len(rows) == 1 and rows[0].latency_ms == 4.1 and rows[0].source == "modeled"


def test_bad_number_names_file_line_and_column(tmp_path):
    bad = GOOD_ROW.replace(",4.1,", ",fast,")
    path = _write(tmp_path, ["# comment", ",".join(COLUMNS), GOOD_ROW, bad])
    with pytest.raises(ConfigError) as err:
        read_profile_csv(path)
    msg = str(err.value)
    assert str(path) in msg and "line 4" in msg and "latency_ms" in msg and "'fast'" in msg


def test_negative_throughput_is_rejected(tmp_path):
    bad = GOOD_ROW.replace(",258.3,", ",-1,")
    path = _write(tmp_path, [",".join(COLUMNS), bad])
    with pytest.raises(ConfigError) as err:
        read_profile_csv(path)
    assert "line 2" in str(err.value) and "throughput_rps" in str(err.value)


def test_missing_column_names_file_and_column(tmp_path):
    header = ",".join(c for c in COLUMNS if c != "memory_mb")
    row = GOOD_ROW.replace(",574.6,", ",")
    path = _write(tmp_path, ["# comment", header, row])
    with pytest.raises(ConfigError) as err:
        read_profile_csv(path)
    msg = str(err.value)
    assert str(path) in msg and "line 2" in msg and "memory_mb" in msg


def test_bad_source_names_file_line_and_column(tmp_path):
    path = _write(tmp_path, [",".join(COLUMNS), GOOD_ROW, GOOD_ROW.replace(",modeled,", ",guessed,")])
    with pytest.raises(ConfigError) as err:
        load_profiles(tmp_path)
    msg = str(err.value)
    assert str(path) in msg and "line 3" in msg and "source" in msg and "guessed" in msg
