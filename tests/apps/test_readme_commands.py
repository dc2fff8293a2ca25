"""The README's commands, as a newcomer runs them: read from README.md, run in a fresh clone with nothing
exported (no COLLAPIPE_DATA_DIR, no FLWR_HOME), and two runs started at once on one machine.

Each run must end with the summary line, leave a run folder with its plots, and leave no process behind
(found by the private Flower home the launcher printed in its ``$ FLWR_HOME=... flwr run ...`` line)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collapipe_flwr.experiments import processes
from tests.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

README = ROOT / "README.md"
PLOTS = {"loss.png", "metric.png", "delay.png", "memory.png"}
SCRUBBED = ("COLLAPIPE_", "FLWR_", "RAY_", "PYTHONPATH")


def readme_block(marker: str) -> list[str]:
    """The command lines of the bash block after ``<!-- readme:<marker> -->`` (comments stripped)."""
    text = README.read_text(encoding="utf-8")
    at = text.index(f"<!-- readme:{marker} -->")
    block = re.search(r"```bash\n(.*?)```", text[at:], re.S)
    assert block is not None, f"no bash block after the {marker} marker"
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def newcomer_env() -> dict[str, str]:
    """This environment minus every variable a user would have had to export; the venv on PATH (activated)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def run_shell(command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """``command`` in bash; on timeout Ctrl-C (the launcher then stops what it started) before giving up."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=newcomer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"{command!r} ran past {timeout_s:.0f} s:\n{out[-3000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_finished_cleanly(result: subprocess.CompletedProcess) -> Path:
    """Summary line, run folder with plots, no process of the run left; returns the run folder."""
    tail = result.stdout[-4000:] + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, tail
    assert re.search(r"^done: validation \w+ [0-9.]+", result.stdout, re.M), tail
    folder = Path(re.findall(r"^collapipe: finished in \d+ s; results in (.+)$", result.stdout, re.M)[-1])
    assert (folder / "summary.json").is_file() and PLOTS <= {p.name for p in (folder / "plots").iterdir()}, tail
    home = re.search(r"^\$ FLWR_HOME=(\S+) ", result.stdout, re.M)
    assert home is not None, tail
    deadline = time.time() + 30
    while time.time() < deadline and processes.pids_with_text(home.group(1)):
        time.sleep(0.5)
    assert not processes.pids_with_text(home.group(1)), "processes of the run were left running"
    assert not Path(home.group(1)).exists(), "the run's private Flower home was left behind"
    return folder


def test_readme_main_and_test_commands_work_in_a_fresh_clone(tmp_path, data_dir):
    (main_command,) = readme_block("main-command")
    (test_command,) = readme_block("test-command")
    prepare = readme_block("data-command")[0]
    assert "/path/to/your/copy" in prepare
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    made = run_shell(prepare.replace("/path/to/your/copy", shlex.quote(str(data_dir))), clone, 120)
    assert made.returncode == 0 and (clone / "data").is_dir(), made.stdout + made.stderr

    # the README's command as written, with the smoke preset appended: what is checked here is that it runs from a
    # fresh clone with nothing exported; the full default run (10 rounds, 3-15 minutes by machine) is what
    # results/operating_point.py times and scores
    folder = assert_finished_cleanly(run_shell(f"{main_command} --run-config \"preset='smoke'\"", clone, 1800))
    assert folder.parent == clone / "runs"  # the README's `runs/<name>/`, from where the command started

    # The test command, narrowed to the tests that read the data folder through the fixture: it must find
    # the clone's ./data with nothing exported.
    tests = run_shell(
        f"{test_command} -p no:cacheprovider tests/data/test_data_command.py tests/config/test_config.py", clone, 900
    )
    assert tests.returncode == 0, tests.stdout[-3000:]
    assert re.search(r"\d+ passed", tests.stdout) and " skipped" not in tests.stdout.splitlines()[-1], tests.stdout


def test_two_runs_started_at_once_both_finish(tmp_path, data_dir):
    (main_command,) = readme_block("main-command")
    commands = [
        f"{main_command} --run-config \"preset='smoke' run-name='{name}'\" "
        f"--run-config \"output-dir='{tmp_path}' data-dir='{data_dir}'\""
        for name in ("first", "second")
    ]
    env = newcomer_env()
    procs = [
        subprocess.Popen(
            ["bash", "-c", c], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in commands
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    folders = [assert_finished_cleanly(r) for r in results]
    assert folders == [tmp_path / "first", tmp_path / "second"]
