"""devtools/cpu_by_process.py: the groups it names, and a process known to burn CPU found in its window."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "devtools" / "cpu_by_process.py"


def _load():
    spec = importlib.util.spec_from_file_location("cpu_by_process", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_by_process = _load()


@pytest.mark.parametrize(
    ("cmdline", "group"),
    [
        ("/venv/bin/python /venv/bin/flwr-simulation --runtime-api-address 127.0.0.1:1", "Flower simulation process"),
        ("ray::StageActor.forward", "device actors"),
        ("ray::ClientAppActor.run", "CUs"),
        ("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "Ray daemons"),
        ("ray::DashboardAgent", "Ray daemons"),
        ("/usr/bin/sleep 5", "other: sleep"),
    ],
)
def test_a_process_is_grouped_by_what_it_is(cmdline, group):
    assert cpu_by_process.group_of(cmdline).startswith(group)


@pytest.mark.e2e
def test_a_busy_process_shows_its_core_seconds():
    """A child spinning one core for the whole 2 s window: its group is credited with about 2 core-seconds
    (the window's CPU time, not its wall: at least 1 even when this machine is shared)."""
    burn = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 6: pass", "cpu-burn-marker"]
    )
    try:
        out = subprocess.run(
            [sys.executable, str(SCRIPT), "--delay", "0.5", "--seconds", "2", "--top", "50"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        burn.kill()
        burn.wait(timeout=30)
    assert re.search(r"^window: 2\.\d s", out, re.M)
    spent = {group: float(seconds) for seconds, group in re.findall(r"^\s*([\d.]+) core-s  (.+)$", out, re.M)}
    pythons = sum(v for k, v in spent.items() if k.startswith("other: python"))  # python, python3, python3.11
    assert 1.0 <= pythons <= 2.2 * 2
    assert spent["all groups"] >= pythons
