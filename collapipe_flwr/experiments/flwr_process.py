"""The `flwr run` process of one launched job (see :mod:`.launch`): started in its own session with its output
on one pipe, awaited up to the job's timeout, then stopped with everything it started (the detached SuperLink and
its children, Ray's raylet / GCS) and its private temp folder removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from collapipe_flwr import shm_leftovers
from collapipe_flwr.experiments import processes


def start_flwr(cmd: list[str], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """Start ``cmd`` in a new session (so its process tree can be stopped), stdout and stderr on one text pipe."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )


def wait_flwr(proc: subprocess.Popen[str], timeout_s: float | None) -> dict[str, Any]:
    """status.json's ``returncode`` and ``timed_out`` once ``proc`` exits or ``timeout_s`` passes."""
    try:
        return {"returncode": proc.wait(timeout=timeout_s), "timed_out": False}
    except subprocess.TimeoutExpired:
        return {"returncode": None, "timed_out": True}


def stop_and_clean(
    proc: subprocess.Popen[str] | None,
    pump: threading.Thread | None,
    log: TextIO,
    flwr_home: Path,
    scratch: Path,
    superlink_copy: Path,
) -> None:
    """Stop the CLI (if still running), the detached SuperLink and every stray naming ``scratch``; close the log;
    keep the SuperLink's log as ``superlink_copy``; delete ``scratch`` (FLWR_HOME and Ray's files) and what the
    stopped processes left in /dev/shm (``shm_leftovers``: a CU killed mid-step leaves its data-plane segment and
    its hand-over folder; entries of processes still running, other runs' included, stay)."""
    if proc is not None and proc.poll() is None:  # timed out or interrupted: the CLI and what it started
        processes.stop_tree([proc.pid], grace_s=5.0)
    processes.stop_processes_mentioning(str(flwr_home), grace_s=10.0)  # the detached SuperLink + children
    processes.stop_processes_mentioning(str(scratch) + os.sep, grace_s=5.0)  # strays, e.g. Ray's raylet / GCS
    if pump is not None:  # EOF once every process holding the pipe is gone
        pump.join(timeout=5.0)
    log.close()
    superlink_log = flwr_home / "local-superlink" / "superlink.log"
    if superlink_log.is_file():
        shutil.copyfile(superlink_log, superlink_copy)
    shutil.rmtree(scratch, ignore_errors=True)
    shm_leftovers.remove_all_stale()
