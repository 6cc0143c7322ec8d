"""The ablation's plumbing: node settings for jigsawd (``bench/replay.py --set``), the run matrix,
and the README table (``bench/ablation.py``). The runs themselves are benches, not tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import ablation  # noqa: E402
import replay  # noqa: E402
from replay import node_with_settings  # noqa: E402

from jigsaw.errors import ConfigError  # noqa: E402
from jigsaw.node import load_node  # noqa: E402

NODE = ROOT / "examples" / "h100x4.toml"


def test_set_writes_a_node_file_with_the_settings_that_loads_from_anywhere(tmp_path: Path) -> None:
    path = node_with_settings(NODE, ["server.lane_shift=false", "control.predictor=mean",
                                     "control.burst_requests=0"], tmp_path / "deep" / "dir")
    node = load_node(path)
    assert not node.server.lane_shift and node.control.predictor == "mean"
    assert node.control.burst_requests == 0
    base = load_node(NODE)
    assert [a.name for a in node.apps] == [a.name for a in base.apps]
    assert node.profiles_dir == base.profiles_dir and node.control.history_bins == base.control.history_bins
    assert node_with_settings(NODE, [], tmp_path) == NODE  # nothing to set: the file itself


def test_every_mechanism_setting_loads_and_switches_its_mechanism(tmp_path: Path) -> None:
    base = load_node(NODE)
    off = load_node(node_with_settings(NODE, list(ablation.MECHANISMS.values()), tmp_path / "off"))
    assert not off.control.replan_on_rate and off.control.burst_requests == 0
    assert base.control.predictor == "profile" and off.control.predictor == "mean"
    assert base.control.drain_wait_slo == 0.25 and off.control.drain_wait_slo == 1.0
    assert base.control.quick_after_refusal and not off.control.quick_after_refusal
    assert base.control.solver_grace_bins == 1.0 and off.control.solver_grace_bins == 0.0
    assert base.control.unplanned_retry_share == 0.85 and off.control.unplanned_retry_share == 0.0
    assert base.control.end_wait_outgrown_above == 1.25 and off.control.end_wait_outgrown_above == 0
    assert base.control.rate_window_grow_z == 3.0 and off.control.rate_window_grow_z == 0
    assert base.control.shrink_min_slices == 1 and off.control.shrink_min_slices == 0
    assert base.control.early_replans_per_bin == 2 and off.control.early_replans_per_bin == 1
    assert base.control.extend_over_draining and not off.control.extend_over_draining
    assert base.control.place_needed_beside and not off.control.place_needed_beside
    assert base.control.extend_in_place_first_below == 0.8 and off.control.extend_in_place_first_below == 0.0
    assert base.control.short_plan_min_gain == 0.1 and off.control.short_plan_min_gain == 0.0
    on = load_node(node_with_settings(NODE, list(ablation.OPTIONAL.values()), tmp_path / "on"))
    assert on.control.shrink_min_slices == 2
    assert not base.server.admission_bottleneck and on.server.admission_bottleneck
    run = ablation.Run("traffic_analysis", "ast", "peak", "with_shrink_hysteresis")
    assert run.settings() == ["control.shrink_min_slices=2"]
    ids = {r.id for r in ablation.matrix()}
    assert {f"traffic_analysis/ast/peak/with_{m}" for m in ablation.OPTIONAL} <= ids


def test_a_bad_setting_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="predictor"):
        node_with_settings(NODE, ["control.predictor=oracle"], tmp_path)
    with pytest.raises(ConfigError, match="rate_window_grow_z"):
        node_with_settings(NODE, ["control.rate_window_grow_z=-1"], tmp_path)
    with pytest.raises(ConfigError, match=r"cut_drains: removed: the making-room policy"):
        node_with_settings(NODE, ["control.cut_drains=true"], tmp_path)
    with pytest.raises(ConfigError, match="shrink_min_slices"):
        node_with_settings(NODE, ["control.shrink_min_slices=-2"], tmp_path)
    with pytest.raises(ConfigError, match=r"end_wait_outgrown_above.*0 \(off\) or a number >= 1"):
        node_with_settings(NODE, ["control.end_wait_outgrown_above=0.5"], tmp_path)
    off = node_with_settings(NODE, ["control.end_wait_outgrown_above=0"], tmp_path / "off")
    assert load_node(off).control.end_wait_outgrown_above == 0
    with pytest.raises(ValueError, match=r"section\.key=value"):
        node_with_settings(NODE, ["lane_shift=false"], tmp_path)


def test_the_matrix_covers_the_issue_and_switches_one_mechanism_at_a_time() -> None:
    ids = {r.id for r in ablation.matrix()}
    for app in ablation.APPS:
        assert f"{app}/ast/day/all" in ids
        assert {f"{app}/{s}/{w}/all" for s in ("as", "at", "st") for w in ("peak", "trough")} <= ids
        assert {f"{app}/ast/peak/no_{m}" for m in ablation.MECHANISMS} <= ids
    run = ablation.Run("traffic_analysis", "ast", "peak", "no_lane_shift")
    assert run.settings() == ["server.lane_shift=false"] and run.bins() == 48
    args = ablation.replay_args(run, "synthetic", 5.0, 20.0, Path("/tmp/x"))
    assert args[args.index("--bins") + 1] == "96:144" and "--set" in args
    steady = ablation.replay_args(ablation.Run("a", "ast", "day", "steady"), "synthetic", 5.0, 20.0,
                                  Path("/tmp/x"))
    assert "--steady-state" in steady and "--settle-seconds" not in steady  # the replay's one bin


def test_the_settled_steady_state_run_settles_longer_than_a_reconfiguration() -> None:
    ids = {r.id for r in ablation.matrix()}
    assert {f"{app}/ast/peak/{v}" for app in ablation.APPS for v in ("steady", "steady_15s")} <= ids
    run = ablation.Run("social_media", "ast", "peak", "steady_15s")
    args = ablation.replay_args(run, "synthetic", 5.0, 30.0, Path("/tmp/x"))
    assert "--steady-state" in args and args[args.index("--settle-seconds") + 1] == "15"
    # 48 bins of 15 s settling + 5 s measured, against one bin's settling for plain steady
    assert ablation.wall_s(run, 5.0) == 48 * 20 + ablation.START_OVERHEAD_S
    assert ablation.wall_s(ablation.Run("social_media", "ast", "peak", "steady"), 5.0) == \
        48 * 10 + ablation.START_OVERHEAD_S
    assert ablation.wall_s(ablation.Run("social_media", "ast", "peak", "all"), 5.0) == \
        48 * 5 + ablation.START_OVERHEAD_S
    # a steady-state run also plays replay's unmeasured tail after each bin; other runs have none
    slo_ms = ablation.app_slos_ms()["social_media"]
    tail = ablation.tail_s(run, 30.0, slo_ms)
    assert tail == replay.default_tail_s(slo_ms, 30.0) > 0
    assert ablation.wall_s(run, 5.0, tail) == 48 * (20 + tail) + ablation.START_OVERHEAD_S
    assert ablation.tail_s(ablation.Run("social_media", "ast", "peak", "all"), 30.0, slo_ms) == 0.0


def test_the_readme_table_is_rewritten_between_its_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\ntext\n")
    runs = [ablation.Run("traffic_analysis", "ast", "peak", "all"), ablation.Run("traffic_analysis", "ast",
                                                                                  "peak", "none")]
    summary = {"slices_pct": 40.0, "accuracy_drop_pct": 9.5, "violation_pct": 1.0, "violation_paper_pct": 1.2,
               "violation_paper_max_pct": 7.0, "bins_with_violations": 3, "sent": 100, "answered": 100,
               "behind_bins": 0, "settle_lost": 0}
    results = {runs[0].id: {"id": runs[0].id, "time_scale": 20.0, "summary": summary, "commit": "abc1234"}}
    ablation.write_readme(readme, ablation.table(runs, results))
    ablation.write_readme(readme, ablation.table(runs, results))  # again: replaced, not appended
    text = readme.read_text()
    assert text.count(ablation.BEGIN) == 1 and text.startswith("# Benchmarks\n\ntext\n")
    assert ("| traffic_analysis | ast | 96:144 | all | 40.0 | 9.50 | 1.00 | 1.20 | 7.00 | 3 | yes (100) | "
            "kept up | 20 | abc1234 |") in text
    # a run measured nowhere is named under the table, not given a row of blanks
    assert "not run |" not in text and "Not run: traffic_analysis ast 96:144: none." in text


def test_a_row_says_how_loaded_the_machine_was_where_the_run_recorded_it() -> None:
    run = ablation.Run("ar_assistant", "ast", "peak", "steady_15s")
    load = {"cpus": 2, "load_1m_mean": 0.8, "load_1m_max": 1.64}
    summary = {**_summary(46.0, 9.0, 0.0), "machine_load": load}
    row = ablation.table([run], {run.id: {"id": run.id, "time_scale": 20.0, "summary": summary,
                                          "commit": "c0"}})
    assert "| kept up, load 1.6 of 2 CPUs | 20 | c0 |" in row
    # a run from before the field, or on a platform without a load average: the column as it was
    for unknown in (None, {"cpus": 2, "load_1m_mean": None, "load_1m_max": None}):
        old = {**_summary(46.0, 9.0, 0.0), **({"machine_load": unknown} if unknown else {})}
        row = ablation.table([run], {run.id: {"id": run.id, "time_scale": 20.0, "summary": old,
                                              "commit": "c0"}})
        assert "| kept up | 20 | c0 |" in row


def test_the_replay_samples_the_load_each_bin_and_says_when_it_passed_the_cpus() -> None:
    loads = iter([0.5, 1.5, 3.25])
    load = replay.MachineLoad(cpus=2, read=lambda: next(loads))
    update, close = replay._progress_factory(2, "ast", load)
    load.sample()  # at the start, as run_space does
    update(0, replay.BinResult())
    update(1, replay.BinResult())
    close()
    assert load.to_json() == {"cpus": 2, "load_1m_mean": 1.75, "load_1m_max": 3.25}
    assert "1.75 mean, 3.25 max on 2 CPUs (past its CPUs" in load.describe()
    quiet = replay.MachineLoad(cpus=2, read=lambda: 0.4)
    quiet.sample()
    assert "past its CPUs" not in quiet.describe()

    def unavailable() -> float:
        raise OSError("no load average")
    none = replay.MachineLoad(cpus=2, read=unavailable)
    none.sample()
    assert none.to_json()["load_1m_max"] is None and none.describe() == "machine load unknown"


def _summary(slices: float, drop: float, violations: float) -> dict[str, float]:
    return {"slices_pct": slices, "accuracy_drop_pct": drop, "violation_pct": violations,
            "violation_paper_pct": violations, "violation_paper_max_pct": violations,
            "bins_with_violations": 1, "sent": 100, "answered": 100, "behind_bins": 0, "settle_lost": 0}


def test_a_row_measured_elsewhere_keeps_its_place_in_the_table(tmp_path: Path) -> None:
    """A results.jsonl of other runs rewrites the table without turning rows it lacks into "not run"."""
    readme = tmp_path / "README.md"
    other = ablation.Run("traffic_analysis", "st", "trough", "all")
    mine = ablation.Run("social_media", "ast", "peak", "all")
    runs = [other, mine, ablation.Run("ar_assistant", "ast", "day", "all")]
    earlier = {other.id: {"id": other.id, "time_scale": 20.0, "summary": _summary(35.3, 0.0, 0.39),
                          "capacity_space": "st", "max_utilization": 0.8}}
    ablation.write_readme(readme, ablation.table(runs, earlier))
    kept = ablation.readme_rows(readme)
    assert set(kept) == {other.id}
    results = {mine.id: {"id": mine.id, "time_scale": 60.0, "summary": _summary(41.2, 6.65, 3.71)}}
    ablation.write_readme(readme, ablation.table(runs, results, kept))
    text = readme.read_text()
    assert "| traffic_analysis | st (its capacity) | 180:228 | all (max util 0.8) | 35.3 |" in text
    assert "| social_media | ast | 96:144 | all | 41.2 | 6.65 | 3.71 |" in text
    assert "Not run: ar_assistant ast 0:288: all." in text
    # rows of runs that recorded no commit say so
    assert "| social_media | ast | 96:144 | all | 41.2 |" in text and "| 60 | unrecorded |" in text
    # a result of this results.jsonl replaces the row the table had
    results[other.id] = {**earlier[other.id], "summary": _summary(30.0, 0.0, 0.0)}
    ablation.write_readme(readme, ablation.table(runs, results, ablation.readme_rows(readme)))
    assert "180:228 | all (max util 0.8) | 30.0 |" in readme.read_text()


def test_fig4_bars_come_from_the_runs_that_exist_and_hatch_at_ten_percent(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = {r.id: {"id": r.id, "summary": _summary(*v)} for r, v in (
        (ablation.Run("ar_assistant", "ast", "peak", "all"), (40.0, 9.0, 12.0)),
        (ablation.Run("ar_assistant", "st", "trough", "all"), (30.0, 0.0, 0.5)),
        (ablation.Run("ar_assistant", "ast", "peak", "none"), (20.0, 9.0, 50.0)))}
    cells = ablation.figure_cells(results, "ar_assistant")
    assert len(cells) == len(ablation.FIGURE_WINDOWS) * len(ablation.FIGURE_SPACES)
    assert cells[("peak", "ast")]["slices_pct"] == 40.0  # the default run, not the "none" one
    assert cells[("trough", "st")]["violation_paper_pct"] == 0.5
    assert [k for k, v in cells.items() if v is not None] == [("trough", "st"), ("peak", "ast")]
    assert ablation.hatched(cells[("peak", "ast")]) and not ablation.hatched(cells[("trough", "st")])
    assert ablation.hatched(_summary(1.0, 1.0, ablation.HATCH_VIOLATION_PCT))
    runs_dir = tmp_path / "runs"
    day = runs_dir / "ar_assistant-ast-day-all"
    day.mkdir(parents=True)
    (day / "ar_assistant-fig4.png").write_bytes(b"per-bin chart")
    sm = ablation.Run("social_media", "as", "peak", "all").id
    results[sm] = {"id": sm, "summary": _summary(20.0, 5.0, 0.0)}
    written = ablation.draw_figures(results, tmp_path / "figs", runs_dir,
                                    apps=("ar_assistant", "social_media", "traffic_analysis"))
    # traffic_analysis has no run here: no figure of only "not run"
    assert [p.name for p in written] == ["ar_assistant-fig4-bars.png", "ar_assistant-fig4-day.png",
                                         "social_media-fig4-bars.png"]
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written[1].read_bytes() == b"per-bin chart"


def test_a_readme_that_does_not_exist_yet_is_created_with_the_table(tmp_path: Path) -> None:
    readme = tmp_path / "new.md"
    runs = [ablation.Run("traffic_analysis", "ast", "peak", "all")]
    ablation.write_readme(readme, ablation.table(runs, {}))
    text = readme.read_text()
    assert text.count(ablation.BEGIN) == 1 and text.count(ablation.END) == 1
    assert "Not run: traffic_analysis ast 96:144: all." in text


def test_a_row_from_before_the_code_column_is_kept_with_its_code_unrecorded(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    old = ("| traffic_analysis | ast | 0:288 | all (max util 0.8) | 37.5 | 9.46 | 0.00 | 0.00 | 0.00 | 0 | "
           "yes (30217) | kept up | 20 |")
    readme.write_text(f"{ablation.BEGIN}\n{old}\n| x | ast | 0:288 | all | not run | | | | | | | | |\n"
                      f"{ablation.END}\n")
    kept = ablation.readme_rows(readme)
    day = ablation.Run("traffic_analysis", "ast", "day", "all")
    assert list(kept) == [day.id] and kept[day.id] == old + " unrecorded |"
    ablation.write_readme(readme, ablation.table([day], {}, kept))
    assert readme.read_text().count(old + " unrecorded |") == 1


def test_the_code_version_names_the_commit_and_a_changed_tree(tmp_path: Path) -> None:
    """A row says which commit it measured; a tree that differs from it is marked, outside git unknown."""
    assert ablation.code_version(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "m"], check=True)
    sha = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    assert ablation.code_version(tmp_path) == sha
    (tmp_path / "notes.txt").write_text("not the node's code\n")
    assert ablation.code_version(tmp_path) == sha
    (tmp_path / "src" / "m.py").write_text("x = 2\n")
    assert ablation.code_version(tmp_path) == f"{sha}+changes"


def test_the_client_keeps_the_peak_rate_times_the_slo_in_flight() -> None:
    # in flight = rate x latency at every time scale: social_media's peak (8500 rps, 700 ms SLO)
    # needs thousands, which the fixed 512 of before held back (its client fell 93 s behind)
    from replay import MIN_CONCURRENCY, client_concurrency
    assert client_concurrency(8500.0, 700.0) >= 8500 * 0.7
    assert client_concurrency(100.0, 650.0) == MIN_CONCURRENCY
    assert client_concurrency(2013.0, 650.0) > client_concurrency(1000.0, 650.0)


def test_a_space_other_than_ast_plays_the_trace_scaled_to_its_own_capacity() -> None:
    st = ablation.Run("traffic_analysis", "st", "trough", "all")
    args = ablation.replay_args(st, "synthetic", 5.0, 20.0, Path("/tmp/x"))
    assert args[args.index("--capacity-space") + 1] == "st" and "--scale-to-capacity" in args
    assert "--capacity-space" not in ablation.replay_args(st, "synthetic", 5.0, 20.0, Path("/tmp/x"),
                                                          per_space_capacity=False)
    ast = ablation.Run("traffic_analysis", "ast", "trough", "all")
    assert "--capacity-space" not in ablation.replay_args(ast, "synthetic", 5.0, 20.0, Path("/tmp/x"))
    s = {"sent": 1, "answered": 1, "behind_bins": 0, "slices_pct": 1.0, "accuracy_drop_pct": 0.0,
         "violation_pct": 0.0, "violation_paper_pct": 0.0, "violation_paper_max_pct": 0.0,
         "bins_with_violations": 0}
    text = ablation.table([st], {st.id: {"summary": s, "time_scale": 20.0, "capacity_space": "st"}})
    assert "| st (its capacity) |" in text


def test_a_space_at_its_own_capacity_gets_the_burst_floor_scaled_like_its_window() -> None:
    # st's capacity is 6% of ast's on traffic_analysis: 40 concurrent requests (123 req/s) were
    # all of st's node; scaled like the window, 2
    assert ablation.scaled_burst_requests(40, 122.7, 2012.9) == 2
    assert ablation.scaled_burst_requests(40, 1.0, 2012.9) == 1  # on stays on
    assert ablation.scaled_burst_requests(0, 122.7, 2012.9) == 0  # off stays off
    assert ablation.scaled_burst_requests(40, 3000.0, 2012.9) == 40  # never above the node's
    st = ablation.Run("traffic_analysis", "st", "trough", "all")
    args = ablation.replay_args(st, "synthetic", 5.0, 20.0, Path("/tmp/x"), burst_requests=2)
    assert args[args.index("--set") + 1] == "control.burst_requests=2"
    off = ablation.Run("traffic_analysis", "ast", "peak", "no_burst_floor")
    args = ablation.replay_args(off, "synthetic", 5.0, 20.0, Path("/tmp/x"), burst_requests=2)
    assert "control.burst_requests=2" not in args  # the run that switches it off keeps it off


def test_every_run_plans_with_headroom_and_scales_its_window_to_the_capacity_at_it(tmp_path: Path) -> None:
    run = ablation.Run("traffic_analysis", "ast", "peak", "all")
    args = ablation.replay_args(run, "synthetic", 5.0, 20.0, tmp_path, max_utilization=0.8)
    assert "planner.max_utilization=0.8" in args
    node = load_node(Path(args[args.index("--capacity-node") + 1]))
    assert node.planner.max_utilization == 0.8
    assert "--capacity-node" not in ablation.replay_args(run, "synthetic", 5.0, 20.0, tmp_path)


def test_replay_refuses_an_unknown_capacity_space(capsys: pytest.CaptureFixture[str]) -> None:
    import replay
    rc = replay.main(["--node", str(NODE), "--app", "traffic_analysis", "--scale-to-capacity",
                      "--capacity-space", "abc"])
    assert rc == 2 and "--capacity-space: unknown space 'abc'" in capsys.readouterr().err
