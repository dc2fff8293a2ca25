"""Sweep launcher and report (collapipe_flwr.experiments).

Fast tests build synthetic job / run folders by hand and check the report against numbers computed
by hand here (sums of the per-round delays, energies, the bottleneck split), the launcher against a
stand-in `flwr` executable that mimics the real CLI's processes (a detached SuperLink found by its
FLWR_HOME path), and the Hydra entry point's config-error path. The slow test runs a real 2-run
multirun of the tiny config through `flwr run` and checks the report has a row per run.

The launcher, the Hydra entry point and the end-to-end runs: test_experiments_launch.py.
"""

from __future__ import annotations

import csv
import json

import pytest

from collapipe_flwr.experiments import aggregate, reductions
from collapipe_flwr.experiments.report import main as report_main
from collapipe_flwr.experiments.report import write_report
from tests.experiment_records import HAND, hand_rounds, labels, scaled_rounds, write_job


# --------------------------------------------------------------------------- aggregation (pure)
def test_run_row_matches_hand_computed_totals():
    row = aggregate.run_row("r", labels(), hand_rounds(), ok=True)
    for key, expected in HAND.items():
        assert row[key] == pytest.approx(expected), key
    assert row["metric"] == "bleu"
    assert (row["S"], row["m"]) == ("1/2", "2/4")
    assert row["delta_last"] == "1,1,0"
    # the split adds up to the delay (compute + D2D + uplink of the bottleneck CU = tau(t))
    assert row["delay_compute_s"] + row["delay_d2d_s"] + row["delay_uplink_s"] == pytest.approx(row["delay_total_s"])


def test_series_and_plan_shape():
    s = aggregate.series(hand_rounds())
    assert s["round"] == [1, 2]
    assert s["delay"] == [5.5, 2.0]
    assert aggregate.cumulative(s["delay"]) == [5.5, 7.5]
    assert aggregate.cumulative([1.0, None, 2.0]) == [1.0, None, None]
    shape = aggregate.plan_shape(hand_rounds())
    assert (shape["S"], shape["m"]) == (2, 4)  # (2, 4) trains twice, (1, 2) once
    assert shape["mean_S"] == pytest.approx(5 / 3)


def test_run_without_records_gives_empty_row():
    row = aggregate.run_row("x", labels(), [], ok=False, error="boom")
    assert row["rounds"] == 0 and row["delay_total_s"] is None and row["final_metric"] is None
    assert row["error"] == "boom" and row["ok"] is False


def test_segment_scheduling_flag_from_config():
    assert (
        aggregate.segment_scheduling({"method": {"segment_scheduling": True}, "scheduler": {"name": "dssra"}}) is True
    )
    assert aggregate.segment_scheduling({"method": {"segment_scheduling": False}, "scheduler": {}}) is False
    assert (
        aggregate.segment_scheduling({"method": {"segment_scheduling": True}, "scheduler": {"name": "uniform"}})
        is False
    )
    assert aggregate.segment_scheduling({}) is None


def test_uniform_partition_detection():
    assert aggregate.is_uniform_partition({"method": {"segment_scheduling": False}, "scheduler": {}}, [])
    assert aggregate.is_uniform_partition(
        {"method": {"segment_scheduling": True}, "scheduler": {"name": "uniform"}}, []
    )
    assert not aggregate.is_uniform_partition(
        {"method": {"segment_scheduling": True}, "scheduler": {"name": "dssra"}}, []
    )
    assert aggregate.is_uniform_partition({}, scaled_rounds(1.0, uniform_delta=(2, 1, 1)))
    assert not aggregate.is_uniform_partition({}, scaled_rounds(1.0, uniform_delta=(3, 1, 0)))


def test_legend_shows_only_what_differs():
    sets = [labels(scheduler="dssra"), labels(scheduler="random"), labels(scheduler="random", V=10)]
    keys = aggregate.distinguishing_labels(sets)
    assert keys == ["scheduler", "V"]
    assert aggregate.legend(sets[2], keys) == "scheduler=random V=10"


# --------------------------------------------------------------------------- delay reductions
def test_delay_reduction_over_common_rounds():
    assert reductions.delay_reduction([1, 2, 3], [2, 2, 4, 100]) == pytest.approx(1 - 6 / 8)
    assert reductions.delay_reduction([], [1]) is None
    assert reductions.delay_reduction([1], [0]) is None
    assert reductions.delay_reduction([1, None], [1, 2]) is None


def test_compare_all_pairs_like_with_like_and_says_na():
    runs = [
        {"labels": labels("collapipe", "dssra", 0.01), "delay": [1.0, 1.0], "ok": True},
        {"labels": labels("collapipe", "dssra", 10.0), "delay": [5.0, 5.0], "ok": True},
        {"labels": labels("collapipe", "random", 0.01), "delay": [2.0, 2.0], "ok": True},
        {"labels": labels("collapipe", "loss_only", 0.01), "delay": [1.0, 3.0, 9.0], "ok": True},
        {"labels": labels("vanilla_fl", "dssra", 0.01), "delay": [3.0, 5.0], "ok": True},
        {"labels": labels("pipeline", "dssra", 0.01), "delay": [100.0, 100.0], "ok": False},  # failed: ignored
    ]
    by = {r["comparison"]: r for r in reductions.compare_all(runs)}
    # method: A = collapipe+dssra (both V: mean [3, 3]), B = vanilla_fl [3, 5] -> 1 - 6/8
    assert by["method: collapipe vs vanilla_fl"]["ours_pct"] == pytest.approx(25.0)
    assert by["method: collapipe vs vanilla_fl"]["paper_pct"] == 15.09
    assert by["method: collapipe vs titanic"]["ours_pct"] is None
    assert by["method: collapipe vs pipeline"]["ours_pct"] is None
    # scheduler: A = dssra at V = 0.01 only ([1, 1]); random [2, 2] -> 50 %; loss_only over 2 common rounds -> 50 %
    assert by["scheduler: dssra vs random"]["ours_pct"] == pytest.approx(50.0)
    assert by["scheduler: dssra vs loss_only"]["ours_pct"] == pytest.approx(50.0)
    assert by["scheduler: dssra vs delay_only"]["ours_pct"] is None
    assert reductions.fmt_pct(None) == "n/a" and reductions.fmt_pct(46.444) == "46.44%"
    assert by["method: collapipe vs vanilla_fl"]["ours_device_pct"] is None  # no on-device series given


def test_on_device_reduction_leaves_the_uplink_out():
    runs = [
        {"labels": labels("collapipe", "dssra", 0.01), "delay": [10.0, 10.0], "device_delay": [1.0, 1.0], "ok": True},
        {"labels": labels("pipeline", "dssra", 0.01), "delay": [5.0, 5.0], "device_delay": [4.0, 4.0], "ok": True},
    ]
    row = {r["comparison"]: r for r in reductions.compare_all(runs)}["method: collapipe vs pipeline"]
    assert row["ours_pct"] == pytest.approx(-100.0)  # 1 - 20/10
    assert row["ours_device_pct"] == pytest.approx(75.0)  # 1 - 2/8


# --------------------------------------------------------------------------- report (files)
def test_report_on_a_synthetic_multirun(tmp_path):
    sweep = tmp_path / "multirun"
    write_job(sweep / "0", labels("collapipe", "dssra"), hand_rounds())
    write_job(sweep / "1", labels("collapipe", "random"), scaled_rounds(11.0))  # 2 rounds of 11 s = 22 s
    write_job(sweep / "2", labels("collapipe", "loss_only"), None, ok=False, error="InfeasiblePlanError: C7 violated")
    write_job(sweep / "10", labels("vanilla_fl", "dssra"), scaled_rounds(5.0, n_rounds=1), ok=False, error="timed out")
    out = write_report(sweep)
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["run"] for r in rows] == ["0", "1", "2", "10"]  # natural order
    assert [r["ok"] for r in rows] == ["True", "True", "False", "False"]
    assert float(rows[0]["delay_total_s"]) == pytest.approx(HAND["delay_total_s"])
    assert float(rows[0]["energy_total_j"]) == pytest.approx(HAND["energy_total_j"])
    assert float(rows[0]["max_device_mem_mib"]) == pytest.approx(200.0)
    assert float(rows[1]["delay_total_s"]) == pytest.approx(22.0)
    assert rows[2]["delay_total_s"] == "" and "C7 violated" in rows[2]["error"]
    md = (out / "results.md").read_text()
    assert "InfeasiblePlanError: C7 violated" in md
    # dssra (7.5 s) vs random (22 s): 1 - 7.5 / 22
    assert f"{100 * (1 - 7.5 / 22):.2f}%" in md
    assert "| 7.12% |" in md and "n/a" in md  # loss_only failed, delay_only absent
    for name in ("fig6_train_loss.png", "fig7_8_compute_time.png", "fig11_total_delay.png"):
        assert (out / name).stat().st_size > 1000, name
    assert not (out / "fig4_delay_grid.png").exists() and "Fig. 4 skipped" in md


def test_report_draws_the_s_by_m_grids_when_the_sweep_varies_them(tmp_path):
    sweep = tmp_path / "grid"
    uniform = {"method": {"name": "collapipe_no_ss", "segment_scheduling": False}, "scheduler": {"name": "dssra"}}
    for i, (S, m) in enumerate([(1, 2), (2, 2), (2, 4)]):
        write_job(sweep / str(i), labels("collapipe_no_ss"), scaled_rounds(S + m, S=S, m=m), config=uniform)
    out = write_report(sweep)
    assert (out / "fig4_delay_grid.png").stat().st_size > 1000
    assert (out / "fig9_10_metric_grid.png").stat().st_size > 1000
    from collapipe_flwr.experiments import figures

    inputs = [
        {
            "labels": labels(),
            "series": aggregate.series(scaled_rounds(S + m, S=S, m=m)),
            "shape": aggregate.plan_shape(scaled_rounds(1.0, S=S, m=m)),
            "final_metric": S * 10.0 + m,
        }
        for S, m in [(1, 2), (2, 2), (2, 4)]
    ]
    assert figures.grid_points(inputs, "mean_delay") == {"translation": {(1, 2): 3.0, (2, 2): 4.0, (2, 4): 6.0}}
    assert figures.grid_points(inputs, "final_metric")["translation"][(2, 4)] == 24.0


def test_report_of_a_plain_flwr_run_folder(tmp_path):
    run = tmp_path / "runs" / "e2e"
    run.mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps(
            {"method": {"name": "collapipe"}, "scheduler": {"name": "dssra", "V": 10.0}, "task": {"name": "ner"}}
        )
    )
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hand_rounds()) + '{"round": 3, "trunc')
    (run / "summary.json").write_text("{}")
    out = write_report(tmp_path / "runs")
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 1 and rows[0]["task"] == "ner" and rows[0]["V"] == "10.0" and rows[0]["ok"] == "True"
    assert float(rows[0]["delay_total_s"]) == pytest.approx(7.5)  # the truncated last line is skipped


def test_report_cli_errors_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        report_main([str(tmp_path / "missing")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: report folder") and "\n" not in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        report_main([str(tmp_path / "empty")])
    assert "no run folders" in capsys.readouterr().err
