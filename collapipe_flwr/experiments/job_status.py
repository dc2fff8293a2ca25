"""A sweep job's ``status.json``: what the launcher knows before `flwr run` starts, how it judges the finished
run (ok needs exit code 0 and a summary.json this run wrote), and writing it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapipe_flwr.atomic_files import file_errors, write_atomic
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.experiments.job import TIMEOUT_ENV, JobSpec
from collapipe_flwr.experiments.log_errors import error_line

STATUS_FILE = "status.json"
LOG_FILE = "flwr.log"
SUPERLINK_LOG_FILE = "superlink.log"


def write_status(job_dir: Path, status: dict, error: type[CollaPipeError] = CollaPipeError) -> Path:
    """Replace the job's status.json atomically (a full disk leaves the previous one whole, never an empty
    file); a disk error is a one-line ``error`` naming the file."""
    path = job_dir / STATUS_FILE
    with file_errors(job_dir, "create the job folder", error):
        job_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(status, indent=2, sort_keys=True, default=str), error)
    return path


def failed_status(job_dir: Path | str, error: str, labels: Mapping[str, Any] | None = None, **extra: Any) -> dict:
    """status.json of a job that could not run (e.g. a config error found before launching)."""
    status = {"ok": False, "error": error, "labels": dict(labels or {}), "run_dir": None, **extra}
    write_status(Path(job_dir), status)
    return status


def initial_status(job: JobSpec, cmd: list[str], log_path: Path) -> dict[str, Any]:
    """status.json's fields known before `flwr run` starts (not ok until :func:`judge` says so)."""
    return {
        "ok": False,
        "error": "",
        "labels": job.labels,
        "overrides": list(job.overrides),
        "run_dir": str(job.run_dir),
        "command": cmd,
        "log": str(log_path),
        "timeout_s": job.timeout_s,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def judge(status: Mapping[str, Any], job: JobSpec, interrupted: bool = False) -> dict:
    """ok / error of a finished launch: ok needs exit code 0 and the run's summary.json."""
    if interrupted:
        return {"ok": False, "error": "interrupted (KeyboardInterrupt); the run was stopped"}
    if status.get("error"):
        return {"ok": False}
    if status.get("timed_out"):
        return {"ok": False, "error": f"timed out after {job.timeout_s:.0f} s; raise {TIMEOUT_ENV} or shrink the run"}
    log_text = _read(job.job_dir / LOG_FILE) + "\n" + _read(job.job_dir / SUPERLINK_LOG_FILE)
    rc = status.get("returncode")
    if rc == 0 and _written_since(job.run_dir / "summary.json", status.get("started_epoch")):
        return {"ok": True, "error": ""}
    found = error_line(log_text)
    if rc != 0:
        return {"ok": False, "error": found or f"flwr run exited with code {rc}; see {job.job_dir / LOG_FILE}"}
    return {"ok": False, "error": found or f"the run wrote no summary.json; see {job.job_dir / LOG_FILE}"}


def _written_since(path: Path, started: float | None) -> bool:
    """``path`` exists and was written by this launch (a finished run's old summary.json does not count). The
    kernel stamps files from a coarse clock (a few ms behind time.time()), hence the 0.1 s of slack."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    return started is None or mtime >= started - 0.1


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
