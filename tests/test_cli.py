"""`collapipe run`: the run config read as `flwr run` reads it, validated before anything starts, the run
folder and data folder fixed up front, num-supernodes following num-clusters, Flower's noise off the console."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from collapipe_flwr.cli import keep_old_logs, parse_run_config, plan_launch
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.experiments.launch import ConsoleEcho


def test_run_config_is_read_like_flwr_run_and_unknown_keys_are_refused(tmp_path):
    parsed = parse_run_config(["num-server-rounds=3 task='ner'", 'overrides="scheduler.V=10 seed=2"'])
    assert parsed == {"num-server-rounds": 3, "task": "ner", "overrides": "scheduler.V=10 seed=2"}
    toml = tmp_path / "rc.toml"
    toml.write_text('num-clusters = 3\nmethod = "vanilla_fl"\n')
    assert parse_run_config([str(toml)]) == {"num-clusters": 3, "method": "vanilla_fl"}
    with pytest.raises(ConfigError, match="unknown run-config key 'num-rounds'"):
        parse_run_config(["num-rounds=3"])


def test_plan_fixes_folders_and_supernodes_from_the_config(tmp_path, data_dir):
    rc = {"num-clusters": 3, "run-name": "mine", "output-dir": "out", "data-dir": str(data_dir)}
    cfg, job = plan_launch(rc, cwd=tmp_path)
    assert job.num_supernodes == 3 == cfg.federation.num_clusters
    assert job.run_dir == tmp_path / "out" / "mine" == job.job_dir  # relative output-dir: from where it started
    assert Path(job.data_dir) == data_dir.resolve()
    assert "run_name=mine" in job.overrides and "federation.num_clusters=3" in job.overrides
    _, fresh = plan_launch({"data-dir": str(data_dir)}, cwd=tmp_path)  # no run-name: a new folder name, fixed now
    assert fresh.run_dir.parent == tmp_path / "runs" and fresh.run_dir.name.endswith("-collapipe-translation")
    assert f"run_name={fresh.run_dir.name}" in fresh.overrides


def test_a_bad_config_is_one_line_and_exit_2_before_flower_starts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "collapipe_flwr", "run", "--run-config", "num-clusters=0 overrides='method.fixed_m=-1'"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == ["error: method.fixed_m=-1 must be >= 0 (0: m chosen by Sub-1)"]
    assert "flwr run" not in proc.stdout and not (tmp_path / "runs").exists()


def test_console_echo_leaves_off_only_the_known_flower_lines():
    out = io.StringIO()
    echo = ConsoleEcho(out)
    for line in (
        "WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n",
        "round 1/2 training CUs [0, 1]\n",
        "INFO :      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>\n",
        "error: something real\n",
    ):
        echo.write(line)
    assert out.getvalue() == "round 1/2 training CUs [0, 1]\nerror: something real\n"
    loud = io.StringIO()
    ConsoleEcho(loud, verbose=True).write("WARNING :   Since flwr 1.32, default simulated SuperNodes changed\n")
    assert loud.getvalue()


def test_a_resumed_run_keeps_the_earlier_logs(tmp_path):
    (tmp_path / "flwr.log").write_text("first")
    (tmp_path / "flwr.1.log").write_text("zeroth")
    keep_old_logs(tmp_path, ["flwr.log", "status.json"])
    assert (tmp_path / "flwr.2.log").read_text() == "first" and not (tmp_path / "flwr.log").exists()
    assert (tmp_path / "flwr.1.log").read_text() == "zeroth"
