"""Sweep launcher and report (collapipe_flwr.experiments).

Fast tests build synthetic job / run folders by hand and check the report against numbers computed
by hand here (sums of the per-round delays, energies, the bottleneck split), the launcher against a
stand-in `flwr` executable that mimics the real CLI's processes (a detached SuperLink found by its
FLWR_HOME path), and the Hydra entry point's config-error path. The slow test runs a real 2-run
multirun of the tiny config through `flwr run` and checks the report has a row per run.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from collapipe_flwr.config import build_run_config, compose, split_overrides
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.experiments import aggregate, processes, reductions
from collapipe_flwr.experiments.flower_command import (
    MAX_UNIX_SOCKET_PATH,
    RAY_SOCKET_SUFFIX,
    TEMP_PREFIX,
    flower_command,
    private_temp_dir,
    private_temp_env,
    run_config_toml,
)
from collapipe_flwr.experiments.job import JobSpec, build_job, forwarded_overrides, override_key, run_timeout_s
from collapipe_flwr.experiments.launch import launch
from collapipe_flwr.experiments.log_errors import error_line
from collapipe_flwr.experiments.report import main as report_main
from collapipe_flwr.experiments.report import write_report

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


# --------------------------------------------------------------------------- synthetic records
def _cluster_row(compute, d2d, uplink, device_energy, cu_energy, selected=True):
    pipe = compute + d2d
    return {
        "pipeline_s": pipe,
        "compute_s": compute,
        "d2d_s": d2d,
        "uplink_s": uplink if selected else 0.0,
        "delay_s": pipe + uplink if selected else 0.0,
        "device_energy_j": device_energy,
        "cu_energy_j": cu_energy if selected else 0.0,
        "gamma": 0.0,
        "Y": 0.0,
    }


def _plan(cluster, selected, S, m, delta):
    return {
        "cluster": cluster,
        "selected": selected,
        "channel": cluster if selected else None,
        "power_w": 0.3,
        "S": S,
        "m": m,
        "delta": delta,
    }


def _record(t, rows, plans, loss, bleu, peaks, round_s, train_s, method="collapipe", scheduler="dssra"):
    delays = [r["delay_s"] for r, p in zip(rows, plans) if p["selected"]]
    return {
        "round": t,
        "method": method,
        "scheduler": scheduler,
        "train_loss": loss,
        "val_bleu": bleu,
        "val_loss": loss,
        "clients": {
            str(p["cluster"]): {
                "num-examples": 10,
                "train-loss": loss,
                "train-losses": [loss],
                "seconds-train": s,
                "device-peak-bytes": pk,
            }
            for p, pk, s in zip([p for p in plans if p["selected"]], peaks, train_s)
        },
        "failures": [],
        "plan": {"round": t, "clusters": plans, "modelled": {}},
        "modelled": {"policy": scheduler, "V": 0.01, "round_delay_s": max(delays), "clusters": rows},
        "measured_s": {"plan_s": 0.01, "round_s": round_s},
    }


def hand_rounds():
    """Two rounds; hand-computed totals in HAND below.

    Round 1: CU0 delay 2+1+1 = 4, CU1 delay 4+1+0.5 = 5.5 (the bottleneck): tau(1) = 5.5 split 4 / 1 / 0.5.
    Round 2: only CU0 trains, delay 1+0.5+0.5 = 2 (CU1's device energy 9 J must be ignored).
    """
    r1 = _record(
        1,
        [_cluster_row(2.0, 1.0, 1.0, [0.5, 0.25], 0.1), _cluster_row(4.0, 1.0, 0.5, [1.0], 0.2)],
        [_plan(0, True, 2, 4, [1, 1, 0]), _plan(1, True, 1, 2, [2, 0, 0])],
        loss=3.0,
        bleu=1.5,
        peaks=[[100 * MIB, 50 * MIB], [200 * MIB]],
        round_s=10.0,
        train_s=[6.0, 7.0],
    )
    r2 = _record(
        2,
        [_cluster_row(1.0, 0.5, 0.5, [0.5, 0.25], 0.1), _cluster_row(3.0, 3.0, 9.0, [9.0], 5.0, selected=False)],
        [_plan(0, True, 2, 4, [1, 1, 0]), _plan(1, False, 2, 4, [1, 1, 0])],
        loss=3.5,
        bleu=2.5,
        peaks=[[120 * MIB, 60 * MIB]],
        round_s=12.0,
        train_s=[5.0],
    )
    r0 = {"round": 0, "val_bleu": 0.0, "val_loss": 9.0}
    return [r0, r1, r2]


HAND = {
    "delay_total_s": 7.5,
    "delay_compute_s": 5.0,
    "delay_d2d_s": 1.5,
    "delay_uplink_s": 1.0,
    "energy_device_j": 0.75 + 1.0 + 0.75,
    "energy_cu_j": 0.1 + 0.2 + 0.1,
    "energy_total_j": 2.9,
    "final_metric": 2.5,
    "final_train_loss": 3.5,
    "min_train_loss": 3.0,
    "measured_round_s": 22.0,
    "measured_train_s": 7.0 + 5.0,
    "max_device_mem_mib": 200.0,
    "rounds": 2,
}


def scaled_rounds(factor: float, n_rounds: int = 2, S: int = 2, m: int = 4, uniform_delta=(1, 1, 0)):
    """Rounds whose only CU has delay `factor` (compute factor/2, D2D factor/4, uplink factor/4)."""
    out = [{"round": 0, "val_bleu": 0.0}]
    for t in range(1, n_rounds + 1):
        out.append(
            _record(
                t,
                [_cluster_row(factor / 2, factor / 4, factor / 4, [0.1], 0.01)],
                [_plan(0, True, S, m, list(uniform_delta))],
                loss=2.0 / t,
                bleu=float(S * 10 + m),
                peaks=[[S * MIB]],
                round_s=1.0,
                train_s=[1.0],
            )
        )
    return out


def write_job(folder: Path, labels: dict, rounds: list | None, ok=True, error="", config=None) -> Path:
    """A sweep job folder as launch writes it: status.json (+ run/ with config.json, rounds.jsonl, summary.json)."""
    folder.mkdir(parents=True)
    run_dir = folder / "run"
    status = {
        "ok": ok,
        "error": error,
        "labels": labels,
        "run_dir": str(run_dir) if rounds is not None else None,
        "wall_s": 30.0,
    }
    (folder / "status.json").write_text(json.dumps(status))
    if rounds is not None:
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps(config or {}))
        (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
        if ok:
            (run_dir / "summary.json").write_text(json.dumps({"final_val": {}}))
    return folder


def labels(method="collapipe", scheduler="dssra", V=0.01, task="translation"):
    return {
        "method": method,
        "scheduler": scheduler,
        "V": V,
        "task": task,
        "model": "transformer_tiny",
        "network": "small",
        "federation": "tiny",
    }


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


# --------------------------------------------------------------------------- job + launcher
def test_forwarded_overrides_leave_launcher_keys_to_the_launcher():
    assert override_key("+extra.a=1") == "extra.a" and override_key("~seed") == "seed"
    got = forwarded_overrides(["method=collapipe", "run_name=x", "+data_dir=/d", "output_dir=o", "scheduler.V=10"])
    assert got == ["method=collapipe", "scheduler.V=10", "run_name=run"]


def test_run_config_toml_round_trips_awkward_overrides(tmp_path):
    overrides = ("method=collapipe", "extra.note='a \"quoted\" word'", "run_name=run")
    job = JobSpec(job_dir=tmp_path / 'j"ob', overrides=overrides, num_supernodes=3, data_dir="/d\\x", timeout_s=1.0)
    parsed = tomllib.loads(run_config_toml(job))
    assert parsed["output-dir"] == str(tmp_path / 'j"ob') and parsed["data-dir"] == "/d\\x"
    assert split_overrides(parsed["overrides"]) == list(overrides)  # what the ServerApp will compose


def test_build_job_validates_once_and_sizes_the_federation(monkeypatch, tmp_path):
    config = compose(["federation=tiny", "federation.num_clusters=3", "network=small"])
    job = build_job(
        config,
        ["federation=tiny", "federation.num_clusters=3"],
        tmp_path / "j",
        {"model": "transformer_small", "federation": "tiny"},
        environ={"COLLAPIPE_DATA_DIR": str(tmp_path)},
    )
    assert job.num_supernodes == 3
    assert job.data_dir == str(tmp_path.resolve())
    assert job.timeout_s == 2 * 600.0 + 600.0  # T * round_timeout_s + margin (federation=tiny)
    assert job.run_dir == (tmp_path / "j" / "run").resolve()
    assert job.labels["model"] == "transformer_small" and job.labels["federation"] == "tiny"
    bad = compose(["method.fixed_m=-1"])
    with pytest.raises(ConfigError, match="fixed_m"):
        build_job(bad, [], tmp_path / "k", environ={"COLLAPIPE_DATA_DIR": str(tmp_path)})
    import collapipe_flwr.config.data_dir as config_module

    monkeypatch.setattr(config_module, "default_data_dirs", lambda cwd=None: [tmp_path / "no-data-here"])
    with pytest.raises(ConfigError, match="no data directory"):
        build_job(config, [], tmp_path / "k", environ={})
    cfg = build_run_config(config)
    assert run_timeout_s(cfg, {"COLLAPIPE_RUN_TIMEOUT_S": "42"}) == 42.0
    with pytest.raises(ConfigError):
        run_timeout_s(cfg, {"COLLAPIPE_RUN_TIMEOUT_S": "soon"})


def test_concurrent_cus_sets_rays_cpu_count_in_the_federation_config(tmp_path):
    """runtime.concurrent_cus reaches flwr as init-args-num-cpus (Ray's CPU count; each SuperNode claims one CPU,
    so that many CUs train at once); 0 leaves Ray its own count, and a negative count is refused at start-up."""
    environ = {"COLLAPIPE_DATA_DIR": str(tmp_path)}
    job = build_job(compose(["runtime.concurrent_cus=3"]), [], tmp_path / "j", environ=environ)
    cmd = flower_command("flwr", tmp_path, tmp_path / "rc.toml", job.num_supernodes, job.concurrent_cus)
    federation = cmd[cmd.index("--federation-config") + 1].split()
    assert "init-args-num-cpus=3" in federation and "client-resources-num-cpus=1" in federation
    default = build_job(compose([]), [], tmp_path / "k", environ=environ)
    cmd = flower_command("flwr", tmp_path, tmp_path / "rc.toml", default.num_supernodes, default.concurrent_cus)
    assert not any(part.startswith("init-args-num-cpus") for part in cmd)
    with pytest.raises(ConfigError, match="runtime.concurrent_cus=-1 must be >= 0"):
        build_job(compose(["runtime.concurrent_cus=-1"]), [], tmp_path / "m", environ=environ)
    # the joint decoder update's barrier waits for every CU: all N train at once unless the config says otherwise
    joint = ["federation.decoder_update=joint", "federation.num_clusters=5"]
    assert build_job(compose(joint), [], tmp_path / "n", environ=environ).concurrent_cus == 5
    capped = build_job(compose([*joint, "runtime.concurrent_cus=2"]), [], tmp_path / "o", environ=environ)
    assert capped.concurrent_cus == 2


def test_error_line_picks_the_telling_line():
    assert error_line("INFO x\nerror: method.fixed_m=0 must be >= 1\nbye") == "method.fixed_m=0 must be >= 1"
    box = "╭─ Error ─────╮\n│ Pattern did not │\n│ match.      │\n╰─────────────╯\n"
    assert error_line(box) == "Pattern did not match."
    tb = "Traceback (most recent call last):\n  File x\nRuntimeError: ray died\n"
    assert error_line(tb) == "RuntimeError: ray died"
    assert error_line("all fine") == ""


FAKE_FLWR = textwrap.dedent('''\
    #!{python}
    """Stand-in for the flwr CLI: reads the run config, starts a detached 'SuperLink' that mentions
    FLWR_HOME in its command line (as flwr's local SuperLink does with --database), logs, exits."""
    import json, os, subprocess, sys, time, tomllib
    from pathlib import Path
    args = sys.argv[1:]
    conf = tomllib.loads(Path(args[args.index("--run-config") + 1]).read_text())
    home = os.environ["FLWR_HOME"]
    assert Path(home, "config.toml").read_text().count(':local:') == 1
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    link = subprocess.Popen([*sleeper, "--database", home + "/local-superlink/state.db"],
                            start_new_session=True)
    Path(os.environ["PIDFILE"]).write_text(str(link.pid))
    if os.environ.get("ENVFILE"):  # what Ray would see, and a stray 'raylet' naming its session folder
        keys = ("FLWR_HOME", "RAY_TMPDIR", "TMPDIR")
        Path(os.environ["ENVFILE"]).write_text(json.dumps({{k: os.environ.get(k) for k in keys}}))
        session = Path(os.environ["RAY_TMPDIR"], "ray", "session_fake")
        (session / "sockets").mkdir(parents=True)
        (session / "logs.txt").write_text("ray session")
        raylet = subprocess.Popen([*sleeper, "--session_dir=" + str(session)], start_new_session=True)
        Path(os.environ["PIDFILE"] + ".raylet").write_text(str(raylet.pid))
    mode = os.environ.get("FAKE_MODE", "ok")
    print("federation:", args[args.index("--federation-config") + 1], flush=True)
    print("overrides:", conf["overrides"], flush=True)
    if mode == "hang":
        time.sleep(600)
    if mode == "quiet":  # exit 0 and write nothing (a run the server refused, a ServerApp that never ran)
        sys.exit(0)
    if mode == "ok":
        run = Path(conf["output-dir"]) / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text("{{}}")
        sys.exit(0)
    if mode == "server_failed":  # flwr run's own exit code is 0 when the ServerApp fails
        print("error: cannot write runs/x/config.json: Read-only file system; set output-dir", flush=True)
        sys.exit(0)
    print("error: C7 (memory) violated in cluster 0; add devices", flush=True)
    sys.exit(2)
''')


@pytest.fixture
def fake_flwr(tmp_path):
    path = tmp_path / "fake_flwr"
    path.write_text(FAKE_FLWR.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_an_old_summary_does_not_make_a_run_that_did_not_happen_a_success(tmp_path, fake_flwr, monkeypatch):
    """flwr exits 0 and writes nothing; the run folder holds a finished run's summary.json from before the launch
    (the CLI used to count it and exit 0: "finished in 18 s")."""
    monkeypatch.setenv("PIDFILE", str(tmp_path / "superlink.pid"))
    monkeypatch.setenv("FAKE_MODE", "quiet")
    old = tmp_path / "job" / "run" / "summary.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"old": true}')
    past = time.time() - 60
    os.utime(old, (past, past))
    job = JobSpec(
        job_dir=tmp_path / "job",
        overrides=("method=collapipe", "run_name=run"),
        num_supernodes=2,
        data_dir=str(tmp_path),
        timeout_s=60.0,
        labels=labels(),
    )
    status = launch(job, echo=None, flwr_exe=str(fake_flwr))
    assert status["ok"] is False and "summary.json" in status["error"]
    assert old.read_text() == '{"old": true}'


@pytest.mark.parametrize("mode", ["ok", "fail", "hang", "server_failed"])
def test_launch_writes_status_and_stops_the_detached_superlink(tmp_path, fake_flwr, monkeypatch, mode):
    pidfile = tmp_path / "superlink.pid"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    monkeypatch.setenv("FAKE_MODE", mode)
    job = JobSpec(
        job_dir=tmp_path / "job",
        overrides=("method=collapipe", "run_name=run"),
        num_supernodes=3,
        data_dir=str(tmp_path),
        timeout_s=4.0 if mode == "hang" else 60.0,
        labels=labels(),
    )
    status = launch(job, echo=None, flwr_exe=str(fake_flwr))
    saved = json.loads((tmp_path / "job" / "status.json").read_text())
    assert saved["ok"] == status["ok"] == (mode == "ok")
    log = (tmp_path / "job" / "flwr.log").read_text()
    assert "num-supernodes=3" in log and "overrides: method=collapipe run_name=run" in log
    if mode == "fail":
        assert saved["error"] == "C7 (memory) violated in cluster 0; add devices" and saved["returncode"] == 2
    if mode == "hang":
        assert saved["timed_out"] is True and "timed out" in saved["error"]
    if mode == "server_failed":
        assert saved["returncode"] == 0 and saved["error"].startswith("cannot write runs/x/config.json")
    superlink = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and processes.alive(superlink):
        time.sleep(0.1)
    assert not processes.alive(superlink), "the detached SuperLink was left running"


def test_launch_keeps_ray_files_in_a_private_temp_folder_and_removes_it(tmp_path, fake_flwr, monkeypatch):
    pidfile, envfile = tmp_path / "superlink.pid", tmp_path / "env.json"
    monkeypatch.setenv("PIDFILE", str(pidfile))
    monkeypatch.setenv("ENVFILE", str(envfile))
    monkeypatch.setenv("FAKE_MODE", "ok")
    job = JobSpec(
        job_dir=tmp_path / "job",
        overrides=("run_name=run",),
        num_supernodes=2,
        data_dir=str(tmp_path),
        timeout_s=60.0,
        labels=labels(),
    )
    status = launch(job, echo=None, flwr_exe=str(fake_flwr))
    assert status["ok"], status
    seen = json.loads(envfile.read_text())
    scratch = Path(seen["RAY_TMPDIR"])
    assert seen["TMPDIR"] == str(scratch) and Path(seen["FLWR_HOME"]).parent == scratch
    assert scratch.name.startswith(TEMP_PREFIX) and len(str(scratch)) + RAY_SOCKET_SUFFIX <= MAX_UNIX_SOCKET_PATH
    assert not scratch.exists(), "the private temp folder (Ray's session folders) was left behind"
    for pid in (int(pidfile.read_text()), int(Path(str(pidfile) + ".raylet").read_text())):
        deadline = time.time() + 5
        while time.time() < deadline and processes.alive(pid):
            time.sleep(0.1)
        assert not processes.alive(pid), "a process of the run was left running"


def test_private_temp_env_names_one_short_folder(tmp_path):
    folder = private_temp_dir()
    try:
        assert private_temp_env(folder) == {"RAY_TMPDIR": str(folder), "TMPDIR": str(folder)}
    finally:
        folder.rmdir()
    with pytest.raises(ValueError, match="too long"):
        private_temp_env(tmp_path / ("x" * 60))


def test_descendants_and_stop_tree(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            " time.sleep(600)",
        ]
    )
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not processes.descendants([parent.pid]):
            time.sleep(0.05)
        (child,) = processes.descendants([parent.pid])
        stopped = processes.stop_tree([parent.pid], grace_s=5)
        assert set(stopped) == {parent.pid, child}
        parent.wait(timeout=5)
        assert not processes.alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_stop_pids_kills_a_process_that_ignores_sigterm_and_returns_once_it_is_gone():
    """A process that traps SIGTERM is SIGKILLed after the grace, and stop_pids returns only when it has exited
    (the deployment test's check right after stop_pids failed on a loaded machine when it did not wait)."""
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True);"
            " time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline().strip() == "ready"  # the handler is installed
        started = time.monotonic()
        assert processes.stop_pids([stubborn.pid], grace_s=0.5) == [stubborn.pid]
        assert time.monotonic() - started >= 0.5  # SIGTERM was ignored for the whole grace
        assert stubborn.poll() == -signal.SIGKILL  # already exited when stop_pids returned
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
        stubborn.stdout.close()


# --------------------------------------------------------------------------- Hydra entry point
def _entry(args, cwd):
    env = dict(os.environ, COLLAPIPE_DATA_DIR=str(cwd))
    return subprocess.run(
        [sys.executable, "-m", "collapipe_flwr.experiments", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_entry_point_bad_config_is_one_line_and_a_sweep_goes_on(tmp_path):
    single = _entry(["method.fixed_m=-1", f"hydra.run.dir={tmp_path / 'single'}"], tmp_path)
    assert single.returncode == 2, single.stderr[-2000:]
    assert single.stderr.strip().splitlines()[-1] == "error: method.fixed_m=-1 must be >= 0 (0: m chosen by Sub-1)"
    assert json.loads((tmp_path / "single" / "status.json").read_text())["ok"] is False
    sweep = _entry(["-m", "method.fixed_m=-2,-1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    statuses = [json.loads((tmp_path / "sweep" / str(i) / "status.json").read_text()) for i in (0, 1)]
    assert [s["ok"] for s in statuses] == [False, False]
    assert "fixed_m=-1" in statuses[1]["error"]
    out = write_report(tmp_path / "sweep")
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 2
    assert "Sweep: `python -m collapipe_flwr.experiments -m method.fixed_m=-2,-1`" in (out / "results.md").read_text()


def test_entry_point_gives_a_task_its_default_model(tmp_path):
    """task=ner without model=: the job validates against the task's own model (bert_small), so the only
    error left is the one we planted."""
    single = _entry(["task=ner", "federation.num_rounds=0", f"hydra.run.dir={tmp_path / 'ner'}"], tmp_path)
    assert single.returncode == 2, single.stderr[-2000:]
    assert single.stderr.strip().splitlines()[-1] == "error: federation.num_rounds=0 must be >= 1"


# --------------------------------------------------------------------------- end to end (Flower)
@pytest.mark.slow
def test_two_run_multirun_of_the_tiny_config_end_to_end(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    env = dict(os.environ, COLLAPIPE_DATA_DIR=str(data_dir), COLLAPIPE_RUN_TIMEOUT_S="900")
    args = [
        "-m",
        "scheduler=dssra,random",
        "task=translation",
        "model=transformer_tiny",
        "federation=tiny",
        "network=small",
        "eval.max_examples=16",
        "federation.local_steps=2",
        "federation.num_rounds=1",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "collapipe_flwr.experiments", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=2000,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [json.loads((sweep / str(i) / "status.json").read_text()) for i in (0, 1)]
    assert all(s["ok"] for s in statuses), [s["error"] for s in statuses]
    out = write_report(sweep)
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["scheduler"] for r in rows] == ["dssra", "random"]
    assert all(r["ok"] == "True" and r["rounds"] == "1" and r["delay_total_s"] for r in rows)
    assert (out / "results.md").read_text().count("| dssra |") + (out / "results.md").read_text().count(
        "| random |"
    ) >= 2


def test_collapipe_run_exits_1_when_the_server_failed_though_flwr_run_exited_0(
    tmp_path, fake_flwr, monkeypatch, data_dir, capsys
):
    from collapipe_flwr.apps import cli

    monkeypatch.setenv("PIDFILE", str(tmp_path / "superlink.pid"))
    monkeypatch.setenv("FAKE_MODE", "server_failed")
    args = cli.build_parser().parse_args(
        ["run", "--run-config", f"output-dir='{tmp_path}' data-dir='{data_dir}' run-name='r'"]
    )
    assert cli.run(args, flwr_exe=str(fake_flwr)) == 1
    assert capsys.readouterr().err.startswith("error: cannot write runs/x/config.json: Read-only file system")
    monkeypatch.setenv("FAKE_MODE", "ok")
    args.run_config = [f"output-dir='{tmp_path}' data-dir='{data_dir}' run-name='run'"]
    assert cli.run(args, flwr_exe=str(fake_flwr)) == 0
