"""Running Flower's CLI from tests: a private FLWR_HOME, offline settings, and every process stopped.

``flwr run .`` starts a detached local SuperLink that outlives the command (docs/architecture.md); it is found by
its ``--database`` path inside our private FLWR_HOME and killed by pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def flower_env(flwr_home: Path, data_dir: Path | None = None) -> dict[str, str]:
    env = os.environ.copy()
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PYTHONUNBUFFERED="1",
        RAY_DEDUP_LOGS="0",
    )
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if data_dir is not None:
        env["COLLAPIPE_DATA_DIR"] = str(data_dir)
    return env


def write_flower_config(flwr_home: Path, text: str) -> None:
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(text)


def local_simulation_config(num_supernodes: int) -> str:
    return (
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n\n'
        f"[superlink.local.options]\nnum-supernodes = {num_supernodes}\n\n"
        "[superlink.local.options.backend.client-resources]\nnum-cpus = 1\nnum-gpus = 0.0\n"
    )


def pids_matching(text: str) -> list[int]:
    """Pids of processes whose command line contains ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_local_superlink(flwr_home: Path) -> None:
    """Stop the detached local SuperLink (and its simulation children) that `flwr run` started."""
    stop_pids(pids_matching(str(flwr_home)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
