"""One run per run folder: a second run of the same name is refused before it writes anything (issue 45).

The reference is another process that holds the folder (as a second `collapipe run` or ServerApp would), and
the kernel's own release of a killed process's lock (SIGKILL, no clean-up code runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.records.run_claim import LAUNCHER_LOCK, SERVER_LOCK, RunFolderBusy, claim_folder
from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid

BASE = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=1 "
    "federation.local_steps=1 runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=16"
)


def _holder(folder, name):
    """A child process that claims ``folder`` and waits; returns it once the claim is held."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from collapipe_flwr.fl.records.run_claim import claim_folder
        claim = claim_folder(Path({str(folder)!r}), {name!r})
        print("held", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.e2e
def test_a_folder_held_by_a_live_process_is_refused_with_its_pid_and_freed_when_that_process_is_killed(tmp_path):
    proc = _holder(tmp_path / "run", SERVER_LOCK)
    try:
        with pytest.raises(RunFolderBusy, match=rf"in use by another ServerApp \(pid {proc.pid}\)"):
            claim_folder(tmp_path / "run", SERVER_LOCK, "ServerApp")
        with claim_folder(tmp_path / "run", LAUNCHER_LOCK):  # the launcher's claim is another lock
            pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
        proc.wait()
    with claim_folder(tmp_path / "run", SERVER_LOCK) as claim:
        assert claim.path.read_text().strip() == str(os.getpid())


@pytest.mark.e2e
def test_a_second_serverapp_of_the_same_run_name_is_refused_before_it_writes_anything(data_dir, tmp_path, capsys):
    """The second run's ServerApp finds the folder held (by the first run's, here a stand-in process) and stops
    with one line; the folder holds nothing of it (no config.json, no rounds.jsonl)."""
    folder = tmp_path / "same"
    proc = _holder(folder, SERVER_LOCK)
    try:
        with pytest.raises(RunFolderBusy, match="pick another run_name"):
            run_server(
                InProcessGrid(2, str(data_dir)),
                {"overrides": f"{BASE} run_name=same", "data-dir": str(data_dir), "output-dir": str(tmp_path)},
            )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert sorted(p.name for p in folder.iterdir()) == [SERVER_LOCK]
    assert "error: run folder" in capsys.readouterr().err
    done = run_server(  # the name is free again once the first run is gone
        InProcessGrid(2, str(data_dir), run_id=9),
        {"overrides": f"{BASE} run_name=same", "data-dir": str(data_dir), "output-dir": str(tmp_path)},
    )
    assert (done / "summary.json").is_file()


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "directory", "fifo"])
def test_a_lock_file_that_is_a_link_or_a_folder_is_refused_naming_the_lock_file(tmp_path, kind):
    """The refusal names the lock file and what it is (it used to blame the run folder and say "free disk
    space"); the link's target is neither followed nor touched."""
    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / SERVER_LOCK
    target = tmp_path / "elsewhere"
    if kind == "symlink":
        target.write_text("keep me\n")
    if kind == "directory":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to(target)
    with pytest.raises(ConfigError) as info:
        claim_folder(folder, SERVER_LOCK)
    message = str(info.value)
    assert "\n" not in message and f"lock file {lock}" in message, message
    says = {"symlink": "a symbolic link", "dangling symlink": "a symbolic link", "directory": "a directory"}
    assert says.get(kind, "a special file") in message, message
    assert "disk space" not in message and "remove it" in message, message
    if kind == "symlink":
        assert target.read_text() == "keep me\n"
    else:
        assert not target.exists()
