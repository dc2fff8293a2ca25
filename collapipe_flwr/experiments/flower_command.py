"""The Flower command and environment of one sweep job: its run config file, the `flwr run` command line,
and the environment that gives it a private FLWR_HOME, free local SuperLink ports and a private temp folder.

The run config goes through a TOML file (same keys as ``--run-config 'overrides="..." ...'``) because
flwr's inline parser cannot carry a double quote inside a value. Ray's files (``<temp>/ray/session_*``) go to
the job's private temp folder through ``RAY_TMPDIR`` / ``TMPDIR`` (:func:`private_temp_env`); the folder is
kept short enough for Ray's unix sockets (:func:`private_temp_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from collapipe_flwr.experiments.job import JobSpec

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
