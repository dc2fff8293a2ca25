"""Running Flower's CLI from tests: a private FLWR_HOME, offline settings, and every process stopped.

``flwr run .`` starts a detached local SuperLink that outlives the command (docs/architecture.md); it is found by
its ``--database`` path inside our private FLWR_HOME and killed by pid, with its descendants
(collapipe_flwr.experiments.processes).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from collapipe_flwr.experiments import flower_command, processes

ROOT = Path(__file__).resolve().parent.parent


def flower_env(flwr_home: Path, data_dir: Path) -> dict[str, str]:
    """The launcher's environment for Flower's CLI (``experiments.flower_command.flower_env``): a private FLWR_HOME
    and, for a ``:local:`` SuperLink, free ports instead of Flower's fixed 39091/39093, so two test processes
    (pytest-xdist's workers) or a user's own local SuperLink never meet on one port."""
    return flower_command.flower_env(os.environ, flwr_home, str(data_dir), free_port(), free_port())


def write_flower_config(flwr_home: Path, text: str) -> None:
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(text)


def local_simulation_config(num_supernodes: int) -> str:
    return (
        '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n\n'
        f"[superlink.local.options]\nnum-supernodes = {num_supernodes}\n\n"
        "[superlink.local.options.backend.client-resources]\nnum-cpus = 1\nnum-gpus = 0.0\n"
    )


# Processes are found and stopped by pid with the launcher's own helpers (psutil), never by a broad name.
pids_matching = processes.pids_with_text
stop_pids = processes.stop_pids


def stop_local_superlink(flwr_home: Path) -> None:
    """Stop the detached local SuperLink (and its simulation children) that `flwr run` started."""
    processes.stop_processes_mentioning(str(flwr_home))


free_port = flower_command.free_port


def run(cmd: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
