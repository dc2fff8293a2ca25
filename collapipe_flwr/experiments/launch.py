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
folder too: the launched command gets ``RAY_TMPDIR`` and ``TMPDIR`` pointing there (:func:`private_temp_env`),
every process on the way to ``ray.init`` inherits them (flwr CLI -> detached SuperLink -> SuperExec ->
simulation process, whose Flower Ray backend starts the head node), and Ray 2.55's
``ray._common.utils.get_default_system_temp_dir`` reads ``RAY_TMPDIR`` first (then ``TMPDIR`` on Linux)
when no ``_temp_dir`` is given. The folder holds the job's FLWR_HOME as well and is deleted afterwards.

The log is streamed to the console and tee'd to ``<job>/flwr.log``; the detached SuperLink and all its
children (and any process whose command line names the private temp folder, e.g. Ray's raylet and GCS)
are stopped by pid afterwards, also on failure, timeout or Ctrl-C. The outcome is written to
``<job>/status.json`` and returned; a failed job never raises (the sweep goes on).

``flwr run`` is pointed at a copy of the app's own files in the private folder (:mod:`.app_files`): the FAB it
builds is byte-identical to the one built from the project root, without Flower walking a project-local
virtual environment first. The command still runs in the project root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from collapipe_flwr.atomic_files import file_errors
from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.experiments.app_files import fab_include_patterns, stage_app
from collapipe_flwr.experiments.flwr_process import start_flwr, stop_and_clean, wait_flwr
from collapipe_flwr.experiments.job import TIMEOUT_ENV, JobSpec
from collapipe_flwr.fl.records.run_claim import LAUNCHER_LOCK, claim_folder

PROJECT_ROOT = CONF_DIR.parent
STATUS_FILE = "status.json"
LOG_FILE = "flwr.log"
RUN_CONFIG_FILE = "run_config.toml"
SUPERLINK_LOG_FILE = "superlink.log"

LOCAL_CONNECTION_TOML = (
    "# Written by collapipe_flwr.experiments.launch: one local simulation SuperLink per sweep job.\n"
    '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n'
)


def toml_string(value: str) -> str:
    """A TOML basic string (JSON's escaping is valid TOML for every character)."""
    return json.dumps(str(value), ensure_ascii=True)


def run_config_toml(job: JobSpec) -> str:
    """The Flower run config of the job: the three keys of pyproject's [tool.flwr.app.config]."""
    return (
        f"overrides = {toml_string(job.overrides_text)}\n"
        f"data-dir = {toml_string(job.data_dir)}\n"
        f"output-dir = {toml_string(str(job.output_dir or job.job_dir))}\n"
    )


def flower_command(
    flwr_exe: str, project_root: Path, run_config_file: Path, num_supernodes: int, concurrent_cus: int = 0
) -> list[str]:
    federation = f"num-supernodes={int(num_supernodes)} client-resources-num-cpus=1 client-resources-num-gpus=0.0"
    if concurrent_cus:  # Ray's CPU count: each SuperNode claims one, so this many CUs train at once
        federation += f" init-args-num-cpus={int(concurrent_cus)}"
    return [
        flwr_exe,
        "run",
        str(project_root),
        "--stream",
        "--run-config",
        str(run_config_file),
        "--federation-config",
        federation,
    ]


def flwr_executable() -> str:
    """The `flwr` CLI next to this interpreter (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "flwr"
    return str(beside) if beside.is_file() else (shutil.which("flwr") or "flwr")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Ray's longest unix socket below its temp folder: /ray/session_<date>_<time>_<us>_<pid>/sockets/plasma_store.N;
# Ray refuses socket paths over 107 bytes (ray._private.utils.validate_socket_filepath), so the folder stays short.
MAX_UNIX_SOCKET_PATH = 107
RAY_SOCKET_SUFFIX = len("/ray/session_2026-01-31_23-59-59_999999_4194304/sockets/plasma_store.99")
TEMP_PREFIX = "cp-"


def private_temp_dir(prefix: str = TEMP_PREFIX) -> Path:
    """A new private folder for one run's temporary files, short enough for Ray's unix sockets.

    Made under the system temp folder (TMPDIR), or under /tmp when that path is too long. The caller
    deletes it (``shutil.rmtree``) once the run's processes are stopped.
    """
    for base in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
        if len(os.fsencode(os.path.join(base, prefix + "x" * 8))) + RAY_SOCKET_SUFFIX <= MAX_UNIX_SOCKET_PATH:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    raise OSError("no temp folder short enough for Ray's unix sockets; set TMPDIR to a short path such as /tmp")


def private_temp_env(base_dir: Path | str) -> dict[str, str]:
    """Environment variables that send a launched run's temporary files, Ray's session folders included,
    into ``base_dir`` (which the caller creates and deletes): ``RAY_TMPDIR`` (read first by Ray for its
    default temp folder, ``<RAY_TMPDIR>/ray``) and ``TMPDIR`` (Python's tempfile and most other tools).

    Merge it into the environment of the launched command: ``env.update(private_temp_env(folder))``.
    """
    path = os.path.abspath(base_dir)
    if len(os.fsencode(path)) + RAY_SOCKET_SUFFIX > MAX_UNIX_SOCKET_PATH:
        raise ValueError(
            f"temp folder {path!r} is too long for Ray's unix sockets (at most "
            f"{MAX_UNIX_SOCKET_PATH - RAY_SOCKET_SUFFIX} bytes); use private_temp_dir()"
        )
    return {"RAY_TMPDIR": path, "TMPDIR": path}


def flower_env(
    base: Mapping[str, str], flwr_home: Path, data_dir: str, http_port: int, control_port: int
) -> dict[str, str]:
    env = dict(base)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        PYTHONUNBUFFERED="1",
        RAY_DEDUP_LOGS="0",
        # Ray's future behaviour now (num_gpus=0 actors keep the visible devices), which also ends its
        # FutureWarning on every ray.init (ray/_private/worker.py)
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
        COLLAPIPE_DATA_DIR=data_dir,
    )
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


_ERROR_LINE = re.compile(r"\berror: (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def error_line(log_text: str) -> str:
    """The most telling one-line error of a failed run's log ("" when none is found).

    Prefers the last ``error: <message>`` line (the project's one-line user errors), then the flwr
    CLI's last error panel, then the last traceback's final line (``SomeError: ...``), then the last
    line mentioning ERROR.
    """
    lines = [_ANSI.sub("", line).strip() for line in log_text.splitlines()]
    lines = [line for line in lines if line]
    for line in reversed(lines):
        match = _ERROR_LINE.search(line)
        if match:
            return match.group(1).strip()
    box = _last_error_box(lines)
    if box:
        return box
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback"):
            tail = [line for line in lines[i + 1 :] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line)]
            if tail:
                return tail[-1]
    for line in reversed(lines):
        if "ERROR" in line:
            return line
    return ""


def _last_error_box(lines: list[str]) -> str:
    """The text of the last rich ``╭─ Error ─╮ ... ╰─╯`` panel the flwr CLI prints, as one line."""
    starts = [i for i, line in enumerate(lines) if line.startswith("╭") and "Error" in line]
    if not starts:
        return ""
    body = []
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("╰"):
            break
        body.append(line.strip("│").strip())
    return " ".join(part for part in body if part)


def write_status(job_dir: Path, status: dict) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / STATUS_FILE
    path.write_text(json.dumps(status, indent=2, sort_keys=True, default=str))
    return path


def failed_status(job_dir: Path | str, error: str, labels: Mapping[str, Any] | None = None, **extra: Any) -> dict:
    """status.json of a job that could not run (e.g. a config error found before launching)."""
    status = {"ok": False, "error": error, "labels": dict(labels or {}), "run_dir": None, **extra}
    write_status(Path(job_dir), status)
    return status


# Flower lines that do not apply to a collapipe run (it sets num-supernodes itself); kept in flwr.log.
QUIET_LINES = (
    "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "To change federation size, use the following command:",
    "flwr federation simulation-config",
    "Manually terminating ClientAppActor",  # Flower stopping its simulation workers at the end of every run
    # a ServerApp that raised: the run's own "error:" line says why, its traceback is in flwr.log
    "Simulation raised an exception",
    "Exit Code: 700",
    "An unhandled exception occurred when running the simulation.",
    "ref-exit-codes/700.html",
)


class ConsoleEcho:
    """A write-only stream for the launcher's log pump: every line to ``out`` (default: the current
    ``sys.stdout``) except :data:`QUIET_LINES` and Python tracebacks, unless ``verbose``.

    A run that fails prints its one-line ``error:`` first; the traceback Flower logs after it (about 40 lines of
    Flower's and the project's frames) stays in flwr.log, and the console gets one line saying where it is."""

    def __init__(self, out: TextIO | None = None, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self._traceback = ""  # "" | "in" (inside one) | "after" (its last line seen)
        self._pointed = False  # the pointer to flwr.log was written for this traceback

    def write(self, line: str) -> int:
        if self.verbose or not self._hidden(_ANSI.sub("", line)):
            (self.out or sys.stdout).write(line)
        return len(line)

    def _hidden(self, plain: str) -> bool:
        """Whether the line is one of QUIET_LINES or part of a traceback (chained ones included: after a
        traceback's last line, blank lines and "The above exception ..." keep it going)."""
        stripped = plain.strip()
        if self._traceback == "after":  # the exception's own line was the last: does a chained part follow?
            if not stripped:
                return True
            self._traceback = "in" if stripped.startswith(TRACEBACK_JOINS) else ""
            if self._traceback:
                return True
            self._pointed = False
        if plain.startswith("Traceback (most recent call last):"):
            self._traceback = "in"
            return True
        if self._traceback == "in":
            if stripped and not plain[:1].isspace() and not stripped.startswith(TRACEBACK_JOINS):
                self._traceback = "after"  # the exception's own line: the run's error line said it already
                if not self._pointed:
                    (self.out or sys.stdout).write(
                        "(the traceback is in the run's flwr.log; --verbose shows it here)\n"
                    )
                    self._pointed = True
            return True
        return any(quiet in plain for quiet in QUIET_LINES)

    def flush(self) -> None:
        (self.out or sys.stdout).flush()


# lines of a chained traceback that join two of its parts (the traceback goes on after them)
TRACEBACK_JOINS = ("The above exception was the direct cause", "During handling of the above exception", "Traceback")


CONSOLE = ConsoleEcho()  # the default echo of a launch: this process's stdout, Flower's known noise left off


class LineSink(Protocol):
    """Where the streamed log goes: a text file, the console, or a filter in front of it."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def _pump(stream, sinks: list[LineSink]) -> None:
    for line in iter(stream.readline, ""):
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (ValueError, OSError):
                pass
    stream.close()


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
            status = {**_initial_status(job, [], job.job_dir / LOG_FILE), "error": str(err)}
            with contextlib.suppress(OSError):  # the disk may be full: status.json is best effort here
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


def _launch_claimed(
    job: JobSpec,
    project_root: Path,
    echo: LineSink | None,
    base_env: Mapping[str, str] | None,
    flwr_exe: str | None,
) -> dict:
    run_config_file = job.job_dir / RUN_CONFIG_FILE
    with file_errors(run_config_file, "write", DiskError):
        run_config_file.write_text(run_config_toml(job))
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
    env = flower_env(os.environ if base_env is None else base_env, flwr_home, job.data_dir, free_port(), free_port())
    env.update(private_temp_env(scratch))
    cmd = flower_command(
        flwr_exe or flwr_executable(), app_dir, run_config_file, job.num_supernodes, job.concurrent_cus
    )
    status = _initial_status(job, cmd, log_path)
    t0 = time.monotonic()
    status["started_epoch"] = time.time()  # judge(): only a summary.json written after this counts
    proc = pump = None
    interrupted = False
    try:
        shown = "$ " + shlex.join([f"FLWR_HOME={flwr_home}", *cmd]) + "\n"  # Flower's own command, visible
        for sink in [log] + ([echo] if echo else []):
            sink.write(shown)
            sink.flush()
        proc = start_flwr(cmd, project_root, env)
        pump = threading.Thread(target=_pump, args=(proc.stdout, [log] + ([echo] if echo else [])), daemon=True)
        pump.start()
        status.update(wait_flwr(proc, job.timeout_s))
    except KeyboardInterrupt:
        interrupted = True
    except OSError as err:
        status["error"] = f"cannot start {cmd[0]}: {err}; install flwr in this environment"
    finally:
        stop_and_clean(proc, pump, log, flwr_home, scratch, job.job_dir / SUPERLINK_LOG_FILE)
        status["wall_s"] = round(time.monotonic() - t0, 3)
        status["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        status.update(judge(status, job, interrupted))
        with file_errors(job.job_dir / STATUS_FILE, "write", DiskError):
            write_status(job.job_dir, status)
    if interrupted:
        raise KeyboardInterrupt
    return status


def _initial_status(job: JobSpec, cmd: list[str], log_path: Path) -> dict[str, Any]:
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
