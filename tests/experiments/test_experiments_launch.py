"""The sweep launcher (collapipe_flwr.experiments): jobs and their Flower command against a stand-in `flwr`
executable that mimics the real CLI's processes (a detached SuperLink found by its FLWR_HOME path), the Hydra
entry point's config-error path, and a real 2-run multirun of the tiny config through `flwr run` (slow)."""

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
from collapipe_flwr.experiments import processes
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
from collapipe_flwr.experiments.report import write_report
from tests.experiment_records import labels


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


def fake_job(tmp_path, job_labels: dict) -> JobSpec:
    """A 2-CU job in ``tmp_path/job`` for the stand-in flwr CLI (:data:`FAKE_FLWR`)."""
    return JobSpec(
        job_dir=tmp_path / "job",
        overrides=("method=collapipe", "run_name=run"),
        num_supernodes=2,
        data_dir=str(tmp_path),
        timeout_s=60.0,
        labels=job_labels,
    )


@pytest.fixture
def fake_flwr(tmp_path):
    path = tmp_path / "fake_flwr"
    path.write_text(FAKE_FLWR.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.mark.e2e
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
    status = launch(fake_job(tmp_path, labels()), echo=None, flwr_exe=str(fake_flwr))
    assert status["ok"] is False and "summary.json" in status["error"]
    assert old.read_text() == '{"old": true}'


@pytest.mark.e2e
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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
def _entry(args, cwd, env=None, timeout=120):
    """``python -m collapipe_flwr.experiments ARGS`` in ``cwd`` (``env``: by default this one's, the data in cwd)."""
    env = dict(os.environ, COLLAPIPE_DATA_DIR=str(cwd)) if env is None else env
    return subprocess.run(
        [sys.executable, "-m", "collapipe_flwr.experiments", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_entry_point_gives_a_task_its_default_model(tmp_path):
    """task=ner without model=: the job validates against the task's own model (bert_small), so the only
    error left is the one we planted."""
    single = _entry(["task=ner", "federation.num_rounds=0", f"hydra.run.dir={tmp_path / 'ner'}"], tmp_path)
    assert single.returncode == 2, single.stderr[-2000:]
    assert single.stderr.strip().splitlines()[-1] == "error: federation.num_rounds=0 must be >= 1"


# --------------------------------------------------------------------------- end to end (Flower)
@pytest.mark.e2e
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
    proc = _entry(args, tmp_path, env=env, timeout=2000)
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


@pytest.mark.e2e
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
