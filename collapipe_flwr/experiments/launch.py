"""Run one sweep job through the same Flower simulation path as `flwr run .`.

Per job: a private FLWR_HOME holding a local simulation connection (``address = ":local:"``), free
ports for the local SuperLink (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` / ``FLWR_LOCAL_CONTROL_API_PORT``,
read by flwr 1.41's CLI) so concurrent runs on one machine never share a SuperLink, offline settings
(``FLWR_DISABLE_UPDATE_CHECK``, ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION``), and

    flwr run <the app's files, staged> --stream --run-config <job>/run_config.toml \
        --federation-config "num-supernodes=N client-resources-num-cpus=1 client-resources-num-gpus=0.0 \
            [init-args-num-cpus=C]"

The run config goes through a TOML file (same keys as ``--run-config 'overrides="..." ...'``) because
flwr's inline parser cannot carry a double quote inside a value. ``--federation-config`` is merged into
the local SuperLink's simulation config (flwr/superlink/servicer/control/control_handlers.py: CopyFrom
then MergeFrom), so ``num-supernodes`` = federation.num_clusters works with a ``:local:`` connection. Each
SuperNode claims one Ray CPU, so Ray trains as many CUs at once as it has CPUs: the machine's cores, or
C = runtime.concurrent_cus when set (Ray's logical CPU count; flwr's client-resources-num-cpus is an integer).

Ray's files (``<temp>/ray/session_*``: logs, sockets, spilled objects) go to the job's private temp
folder too: the launched command gets ``RAY_TMPDIR`` and ``TMPDIR`` pointing there
(:func:`.flower_command.private_temp_env`), every process on the way to ``ray.init`` inherits them (flwr CLI ->
detached SuperLink -> SuperExec -> simulation process, whose Flower Ray backend starts the head node), and Ray 2.55's
``ray._common.utils.get_default_system_temp_dir`` reads ``RAY_TMPDIR`` first (then ``TMPDIR`` on Linux)
when no ``_temp_dir`` is given. The folder holds the job's FLWR_HOME as well and is deleted afterwards.

The log is streamed to the console and tee'd to ``<job>/flwr.log``; the detached SuperLink and all its
children (and any process whose command line names the private temp folder, e.g. Ray's raylet and GCS)
are stopped by pid afterwards, also on failure, timeout or Ctrl-C. The outcome is written to
``<job>/status.json`` (:mod:`.job_status`) and returned; a failed job never raises (the sweep goes on).

``flwr run`` is pointed at a copy of the app's own files in the private folder (:mod:`.app_files`): the FAB it
builds is byte-identical to the one built from the project root, without Flower walking a project-local
virtual environment first. The command still runs in the project root.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from collapipe_flwr.atomic_files import file_errors, write_atomic
from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.experiments.app_files import fab_include_patterns, stage_app
from collapipe_flwr.experiments.console_echo import CONSOLE, LineSink, pump_lines
from collapipe_flwr.experiments.flower_command import (
    LOCAL_CONNECTION_TOML,
    flower_command,
    flower_env,
    flwr_executable,
    free_port,
    private_temp_dir,
    private_temp_env,
    run_config_toml,
)
from collapipe_flwr.experiments.flwr_process import start_flwr, stop_and_clean, wait_flwr
from collapipe_flwr.experiments.job import JobSpec
from collapipe_flwr.experiments.job_status import (
    LOG_FILE,
    STATUS_FILE,
    SUPERLINK_LOG_FILE,
    initial_status,
    judge,
    write_status,
)
from collapipe_flwr.experiments.run_memory import RunMemorySampler, run_pids, write_run_memory
from collapipe_flwr.fl.records.run_claim import LAUNCHER_LOCK, claim_folder

PROJECT_ROOT = CONF_DIR.parent
RUN_CONFIG_FILE = "run_config.toml"


def launch(
    job: JobSpec,
    project_root: Path = PROJECT_ROOT,
    echo: LineSink | None = CONSOLE,
    base_env: Mapping[str, str] | None = None,
    flwr_exe: str | None = None,
    keep_logs: bool = False,
) -> dict:
    """Run the job's `flwr run`, always clean up, write and return status.json's content.

    The job folder is claimed first (fl/records/run_claim.py): a second launcher of the same folder is refused
    with :class:`RunFolderBusy` before it writes anything there. ``keep_logs`` (a resumed run) renames the earlier
    attempt's logs first. A disk error before `flwr run` starts (a full or read-only output disk) is a failed
    status with one line naming the file, and the private temp folder is removed. ``flwr_exe`` replaces the
    `flwr` CLI (tests use a stand-in that mimics its processes).
    """
    with claim_folder(job.job_dir, LAUNCHER_LOCK, "collapipe launcher"):
        try:
            if keep_logs:
                keep_old_logs(job.job_dir, (LOG_FILE, STATUS_FILE, SUPERLINK_LOG_FILE))
            return _launch_claimed(job, project_root, echo, base_env, flwr_exe)
        except DiskError as err:
            status = {**initial_status(job, [], job.job_dir / LOG_FILE), "error": str(err)}
            with contextlib.suppress(CollaPipeError):  # the disk may be full: status.json is best effort here
                write_status(job.job_dir, status)
            return status


class DiskError(CollaPipeError):
    """The launcher could not write what a run needs before it starts."""


def keep_old_logs(folder: Path, names: Sequence[str]) -> None:
    """A resumed run keeps the logs of the attempts before it: ``flwr.log`` -> ``flwr.1.log``, ..."""
    for name in names:
        path = folder / name
        if path.is_file():
            n = 1
            while (folder / f"{path.stem}.{n}{path.suffix}").exists():
                n += 1
            with file_errors(path, "rename", DiskError):
                path.rename(folder / f"{path.stem}.{n}{path.suffix}")


def _prepare_files(job: JobSpec, project_root: Path) -> tuple[Path, Path, Path, TextIO]:
    """Write the job's run config, make its private temp folder (Flower home, staged app) and open its log:
    ``(scratch, flwr_home, app_dir, log)``. A failure removes the temp folder; a disk error is :class:`DiskError`."""
    run_config_file = job.job_dir / RUN_CONFIG_FILE
    write_atomic(run_config_file, run_config_toml(job), DiskError)  # a full disk keeps the previous file whole
    with file_errors(Path(tempfile.gettempdir()), "make a private temp folder in", DiskError):
        scratch = private_temp_dir()  # the job's FLWR_HOME, Ray's session folders and other temp files
    try:
        with file_errors(scratch, "prepare the run's Flower home and app in", DiskError):
            flwr_home = scratch / "flwr-home"
            flwr_home.mkdir()
            (flwr_home / "config.toml").write_text(LOCAL_CONNECTION_TOML)
            # Flower builds the FAB from a folder holding only the app's files (app_files.py: the same FAB, built
            # in a fraction of a second instead of walking a project-local .venv)
            use_stage = fab_include_patterns(project_root)
            app_dir = stage_app(project_root, scratch / "app") if use_stage else project_root
        log_path = job.job_dir / LOG_FILE
        with file_errors(log_path, "write", DiskError):
            log = log_path.open("w", encoding="utf-8")
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch, flwr_home, app_dir, log


def _sample_memory(cli_pid: int, flwr_home: Path, scratch: Path) -> RunMemorySampler:
    """Start sampling the summed PSS of the run's processes every second (:mod:`.run_memory`)."""
    sampler = RunMemorySampler(lambda: run_pids(cli_pid, flwr_home, scratch))
    sampler.start()
    return sampler


def _launch_claimed(
    job: JobSpec,
    project_root: Path,
    echo: LineSink | None,
    base_env: Mapping[str, str] | None,
    flwr_exe: str | None,
) -> dict:
    scratch, flwr_home, app_dir, log = _prepare_files(job, project_root)
    env = flower_env(os.environ if base_env is None else base_env, flwr_home, job.data_dir, free_port(), free_port())
    env.update(private_temp_env(scratch))
    cmd = flower_command(
        flwr_exe or flwr_executable(), app_dir, job.job_dir / RUN_CONFIG_FILE, job.num_supernodes, job.concurrent_cus
    )
    status = initial_status(job, cmd, job.job_dir / LOG_FILE)
    t0 = time.monotonic()
    status["started_epoch"] = time.time()  # judge(): only a summary.json written after this counts
    proc = pump = sampler = None
    interrupted = False
    try:
        shown = "$ " + shlex.join([f"FLWR_HOME={flwr_home}", *cmd]) + "\n"  # Flower's own command, visible
        for sink in [log] + ([echo] if echo else []):
            sink.write(shown)
            sink.flush()
        proc = start_flwr(cmd, project_root, env)
        sampler = _sample_memory(proc.pid, flwr_home, scratch)
        pump = threading.Thread(target=pump_lines, args=(proc.stdout, [log] + ([echo] if echo else [])), daemon=True)
        pump.start()
        status.update(wait_flwr(proc, job.timeout_s))
    except KeyboardInterrupt:
        interrupted = True
    except OSError as err:
        status["error"] = f"cannot start {cmd[0]}: {err}; install flwr in this environment"
    finally:
        if sampler is not None:  # before the processes are stopped: their memory at the end is part of the run
            status.update(write_run_memory(sampler.stop(), job.job_dir, job.run_dir))
        stop_and_clean(proc, pump, log, flwr_home, scratch, job.job_dir / SUPERLINK_LOG_FILE)
        status["wall_s"] = round(time.monotonic() - t0, 3)
        status["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        status.update(judge(status, job, interrupted))
        write_status(job.job_dir, status, DiskError)
    if interrupted:
        raise KeyboardInterrupt
    return status
