"""`collapipe run`: the run config read as `flwr run` reads it, validated before anything starts, the run
folder and data folder fixed up front, num-supernodes following num-clusters, Flower's noise off the console."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from collapipe_flwr.apps.cli import parse_run_config, plan_launch
from collapipe_flwr.config import compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.experiments import processes
from collapipe_flwr.experiments.console_echo import ConsoleEcho
from collapipe_flwr.experiments.job import build_job
from collapipe_flwr.experiments.launch import keep_old_logs


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


@pytest.mark.e2e
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


FAILED_RUN_LOG = """\
\x1b[91mERROR \x1b[0m:     error: runtime.server_device=cuda but this process sees no CUDA GPU
error: runtime.server_device=cuda but this process sees no CUDA GPU
\x1b[91mERROR \x1b[0m:     Simulation raised an exception
Traceback (most recent call last):
  File "/x/flwr/simulation/app.py", line 337, in run_simulation_process
    simulation_result = _run_simulation(
                        ^^^^^^^^^^^^^^^^
ValueError: the cause

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/x/collapipe_flwr/accelerator.py", line 43, in resolve_device
    raise ConfigError(
collapipe_flwr.errors.ConfigError: runtime.server_device=cuda but this process sees no CUDA GPU
\x1b[91mERROR \x1b[0m:     Exit Code: 700

An unhandled exception occurred when running the simulation.

For more information, visit: <https://flower.ai/docs/framework/1.42/en/ref-exit-codes/700.html>
round 2 goes on
"""


def test_console_echo_leaves_a_failed_runs_traceback_in_the_log_and_keeps_its_error_line():
    """Flower logs the ServerApp's traceback (about 40 lines) after the run's own one-line error: the console
    keeps the error and a pointer, flwr.log (every line, the pump's other sink) the traceback."""
    out = io.StringIO()
    echo = ConsoleEcho(out)
    for line in FAILED_RUN_LOG.splitlines(keepends=True):
        echo.write(line)
    shown = [line for line in out.getvalue().splitlines() if line.strip()]
    assert shown == [
        "\x1b[91mERROR \x1b[0m:     error: runtime.server_device=cuda but this process sees no CUDA GPU",
        "error: runtime.server_device=cuda but this process sees no CUDA GPU",
        "(the traceback is in the run's flwr.log; --verbose shows it here)",
        "round 2 goes on",
    ]
    loud = io.StringIO()
    verbose = ConsoleEcho(loud, verbose=True)
    for line in FAILED_RUN_LOG.splitlines(keepends=True):
        verbose.write(line)
    assert loud.getvalue() == FAILED_RUN_LOG


def test_a_resumed_run_keeps_the_earlier_logs(tmp_path):
    (tmp_path / "flwr.log").write_text("first")
    (tmp_path / "flwr.1.log").write_text("zeroth")
    keep_old_logs(tmp_path, ["flwr.log", "status.json"])
    assert (tmp_path / "flwr.2.log").read_text() == "first" and not (tmp_path / "flwr.log").exists()
    assert (tmp_path / "flwr.1.log").read_text() == "zeroth"


def _cli(args: list[str], tmp_path: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collapipe_flwr", "run", *args], cwd=tmp_path, capture_output=True, text=True, **kw
    )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "files,extra,needle",
    [
        (("config.json", "rounds.jsonl", "summary.json"), "", "already holds a run"),  # a rerun without resume
        (("config.json", "rounds.jsonl", "summary.json"), " resume=true", "nothing to resume"),  # a finished run
    ],
)
def test_a_run_folder_the_server_would_refuse_is_refused_before_anything_is_written(
    tmp_path, data_dir, files, extra, needle
):
    folder = tmp_path / "runs" / "done"
    folder.mkdir(parents=True)
    for name in (*files, "flwr.log", "status.json"):
        (folder / name).write_text(f"old {name}")
    rc = f"run-name='done' resume={'true' if extra else 'false'} data-dir='{data_dir}'"
    proc = _cli(["--run-config", rc], tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
    for name in (*files, "flwr.log", "status.json"):  # the old run's files, logs included, are intact
        assert (folder / name).read_text() == f"old {name}"
    assert sorted(p.name for p in folder.iterdir()) == sorted((*files, "flwr.log", "status.json"))


def test_two_unnamed_runs_in_the_same_second_get_their_own_folders(tmp_path, data_dir, monkeypatch):
    import collapipe_flwr.fl.records.run_log as run_log

    monkeypatch.setattr(run_log.time, "strftime", lambda fmt: "20261125-000000")  # the same second
    folders = [plan_launch({"data-dir": str(data_dir)}, cwd=tmp_path)[1].run_dir for _ in range(3)]
    assert [f.name for f in folders] == [
        "20261125-000000-collapipe-translation",
        "20261125-000000-collapipe-translation-2",
        "20261125-000000-collapipe-translation-3",
    ]
    assert all(f.is_dir() for f in folders)


DRIVER = """
import sys
from collapipe_flwr.apps.cli import build_parser, run
sys.exit(run(build_parser().parse_args(sys.argv[2:]), flwr_exe=sys.argv[1]))
"""


@pytest.mark.e2e
def test_sigterm_stops_the_run_and_everything_it_started(tmp_path, data_dir, monkeypatch):
    """`kill <pid>` of `collapipe run` used to end only the CLI: the run went on and the SuperLink stayed."""
    from tests.experiments.test_experiments_launch import FAKE_FLWR

    fake = tmp_path / "fake_flwr"
    fake.write_text(FAKE_FLWR.format(python=sys.executable))
    fake.chmod(0o755)
    pidfile = tmp_path / "superlink.pid"
    env = {**os.environ, "PIDFILE": str(pidfile), "FAKE_MODE": "hang"}
    rc = f"run-name='killed' data-dir='{data_dir}'"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake), "run", "--run-config", rc],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while not pidfile.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert pidfile.exists(), "the stand-in flwr never started"
        superlink = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err, (proc.returncode, err)  # the CLI's own words if not
    deadline = time.time() + 10
    while time.time() < deadline and processes.alive(superlink):
        time.sleep(0.1)
    assert not processes.alive(superlink), "the SuperLink was left running after SIGTERM"


def test_gpu_shares_that_cannot_all_be_granted_are_refused_before_flower_starts(tmp_path, data_dir, monkeypatch):
    """2 CUs x 3 devices (conf/network/small) x 0.25 GPU = 1.5 GPUs on a 1-GPU machine left CU 0's actors pending
    on an H100 while CU 1 trained; the launcher refuses it and names the share that fits (1 / 6, rounded down)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    rc = {"num-clusters": 2, "device": "cuda", "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    too_much = "runtime.actor_num_gpus=0.25 runtime.concurrent_cus=2 network=small"
    with pytest.raises(
        ConfigError,
        match=r"0\.25 x 3 devices per CU x 2 CUs .* = 1\.5 GPUs, but this machine has 1; "
        r"set runtime.actor_num_gpus<=0\.166",
    ):
        plan_launch({**rc, "overrides": too_much}, cwd=tmp_path)
    plan_launch({**rc, "overrides": too_much.replace("0.25", "0.166")}, cwd=tmp_path)  # 6 x 0.166 = 0.996 fits
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a second GPU takes the same share
    plan_launch({**rc, "overrides": too_much}, cwd=tmp_path)
    plan_launch({**rc, "device": "cpu", "overrides": too_much}, cwd=tmp_path)  # on the CPU no GPU is reserved
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    sweep_job = [*too_much.split(), "runtime.device=cuda", "federation.num_clusters=2", f"data_dir={data_dir}"]
    with pytest.raises(ConfigError, match=r"= 1\.5 GPUs, but this machine has 1"):  # a sweep's job, the same check
        build_job(compose(sweep_job), [], tmp_path / "job")


@pytest.mark.e2e
def test_a_second_launcher_of_a_live_run_name_exits_2_and_touches_none_of_its_files(tmp_path, data_dir):
    """Two `collapipe run` of one run-name at once: the second is refused before it writes (the first's flwr.log
    and status.json intact), exit 2, one line naming the holder's pid."""
    from collapipe_flwr.fl.records.run_claim import LAUNCHER_LOCK
    from tests.fl.records.test_run_claim import _holder

    folder = tmp_path / "runs" / "busy"
    holder = _holder(folder, LAUNCHER_LOCK)  # the first launcher, mid-run
    try:
        for name in ("flwr.log", "status.json"):
            (folder / name).write_text(f"first run's {name}")
        proc = _cli(["--run-config", f"run-name='busy' data-dir='{data_dir}'"], tmp_path, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"in use by another collapipe launcher (pid {holder.pid})" in lines[0]
    for name in ("flwr.log", "status.json"):
        assert (folder / name).read_text() == f"first run's {name}"


DISK_FULL_DRIVER = """
import resource, signal, sys, tempfile
import torch  # imported (and Python's temp folder probed) while files can still grow
from collapipe_flwr.apps.cli import main
from collapipe_flwr.experiments import launch
tempfile.gettempdir()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write over the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_a_disk_that_takes_no_byte_at_start_is_one_line_exit_1_and_leaves_no_temp_folder(tmp_path, data_dir):
    """No file can grow (RLIMIT_FSIZE = 0: every write fails as on a full disk; folders can still be made): the
    launcher used to end with an OSError traceback and leave its private temp folder behind."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL_DRIVER, "run", "--run-config", f"run-name='full' data-dir='{data_dir}'"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write") and "run_config.toml" in lines[0], lines
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list(temp.iterdir()) == []  # no private temp folder left


@pytest.mark.e2e
def test_a_resume_whose_checkpoint_would_run_code_exits_2_before_flower_starts(tmp_path, data_dir):
    """`collapipe run ... resume=true` reads checkpoint.pt without running it before anything starts: a payload
    whose unpickling would write a marker file is refused with one line naming the file, exit 2."""
    from tests.fl.server.test_safe_loading import _RunsCode

    folder = tmp_path / "runs" / "hostile"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    torch.save({"format": 2, "round": 1, "model": _RunsCode(tmp_path / "marker")}, folder / "checkpoint.pt")
    proc = _cli(["--run-config", f"run-name='hostile' resume=true data-dir='{data_dir}'"], tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(folder / "checkpoint.pt") in lines[0] and "could run code" in lines[0], lines
    assert not (tmp_path / "marker").exists()
    assert not (folder / "flwr.log").exists()  # refused before the launcher wrote anything
