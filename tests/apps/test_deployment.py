"""Deployment on loopback: a SuperLink and two SuperNodes (real processes, random free ports) run one
round of the real protocol, the per-step activations travelling over the gRPC data plane. Every process
is stopped by pid at the end."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from collapipe_flwr.experiments.processes import alive
from tests.flower_env import ROOT, flower_env, free_port, run, stop_pids, write_flower_config

# slow: the flwr run simulation (test_flwr_run.py) is the README command's Flower run
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

OVERRIDES = (
    "task=classification model=bert_tiny federation=tiny network=small federation.num_rounds=1 "
    "federation.local_steps=3 runtime.backend=local eval.max_examples=64 run_name=deploy"
)


def _wait_healthy(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"SuperLink on port {port} not healthy after {timeout_s}s")


def test_superlink_and_two_supernodes_run_one_round(tmp_path, data_dir):
    home, out = tmp_path / "flwr_home", tmp_path / "runs"
    link_port = free_port()
    write_flower_config(
        home,
        f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n',
    )
    env = flower_env(home, data_dir)
    logs = {}
    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str]) -> None:
        logs[name] = open(tmp_path / f"{name}.log", "w")
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    try:
        start("superlink", _superlink_command(link_port, tmp_path / "state.db"))
        _wait_healthy(link_port)
        for pid in range(2):
            start(f"supernode{pid}", _supernode_command(link_port, pid))
        run_config = f'overrides="{OVERRIDES}" output-dir="{out}"'
        proc = run(["flwr", "run", ".", "deploy", "--stream", "--run-config", run_config], env, ROOT, timeout=900)
    finally:
        stop_pids([p.pid for p in procs])
        for fh in logs.values():
            fh.close()
    server_log = (tmp_path / "superlink.log").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + server_log[-3000:]
    records = [json.loads(x) for x in (out / "deploy" / "rounds.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["round"] == 1]
    assert trained, proc.stdout[-3000:]
    clients = trained[0]["clients"]
    assert sorted(clients) == ["0", "1"]
    assert all(c["steps"] == 3 for c in clients.values())
    assert "val_accuracy" in trained[0]
    left = _unreaped(procs)
    assert not left, f"still running after stop_pids: {left}"


def _superlink_command(port: int, database: Path) -> list[str]:
    return [
        "flower-superlink",
        "--insecure",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
        "--database",
        str(database),
    ]


def _supernode_command(link_port: int, partition: int) -> list[str]:
    return [
        "flower-supernode",
        "--insecure",
        "--superlink",
        f"127.0.0.1:{link_port}",
        "--port",
        str(free_port()),
        "--node-config",
        f"partition-id={partition} num-partitions=2",
    ]


def _unreaped(procs: list[subprocess.Popen]) -> list[str]:
    """stop_pids returns once each process is gone or a zombie; reap them (a SIGKILLed process on a loaded machine
    can take a moment to become one), and name any that is still running."""
    left = []
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            left.append(f"{p.args[0]} (pid {p.pid}, {alive(p.pid) and psutil.Process(p.pid).status()})")
    return left
