"""The memory of a run (experiments/run_memory.py): summed PSS, by kind of process, against hand-made processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from collapipe_flwr.experiments.launch import launch
from collapipe_flwr.experiments.run_memory import (
    MEMORY_FILE,
    MIB,
    ProcessPeak,
    RunMemory,
    device_shares,
    kind_of,
    read_pss,
)

# A process that maps ``SHARED`` MiB of one /dev/shm file and, if asked, allocates ``PRIVATE`` MiB of its own,
# touching every page; it says "ready" once and again after touching, then waits to be killed.
HOLDER = textwrap.dedent("""\
    import mmap, os, sys
    path, shared_mib, private_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print("ready", flush=True); sys.stdin.readline()
    fd = os.open(path, os.O_RDWR)
    view = mmap.mmap(fd, shared_mib << 20)
    total = sum(view[i] for i in range(0, shared_mib << 20, 4096))  # touch every shared page
    private = bytearray(b"x" * (private_mib << 20))
    print("touched", total, len(private), flush=True); sys.stdin.readline()
""")


def test_the_kind_of_a_process_comes_from_its_command_line():
    assert kind_of("ray::StageActor.forward()") == "device actors"
    assert kind_of("ray::ClientAppActor") == "CU workers"
    assert kind_of("ray::IDLE") == "Ray idle workers"
    assert kind_of("ray::DashboardAgent") == kind_of("ray::RuntimeEnvAgent") == "Ray (GCS, raylet, agents)"
    assert (
        kind_of("/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node") == "Ray (GCS, raylet, agents)"
    )
    assert kind_of("/v/bin/python /v/bin/flwr-simulation --app x") == "server (ServerApp, decoder)"
    assert kind_of("/v/bin/python /v/bin/flower-superlink --database d") == "Flower (CLI, SuperLink, SuperExec)"
    assert kind_of("/v/bin/python /v/bin/flwr run app --stream") == "Flower (CLI, SuperLink, SuperExec)"
    assert kind_of("sleep 10") == "other"


def test_peaks_are_of_the_summed_sample_and_of_each_kind_at_its_own_peak():
    memory = RunMemory(every_s=1.0)
    memory.add_sample([(1, "ray::StageActor", 100), (2, "ray::StageActor", 50), (3, "flwr-simulation", 400)])
    memory.add_sample([(1, "ray::StageActor", 300), (2, "ray::StageActor", 20), (3, "flwr-simulation", 100)])
    assert memory.samples == 2
    assert memory.peak_total_bytes == 550  # 100 + 50 + 400, not the sum of the peaks (300 + 50 + 400)
    assert memory.peak_by_kind_bytes == {"device actors": 320, "server (ServerApp, decoder)": 400}
    assert memory.processes[1].peak_pss_bytes == 300 and memory.processes[2].peak_pss_bytes == 50


def _holders(path, n_shared: int, shared_mib: int, private_mib: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(n_shared):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path), str(shared_mib), str(private_mib if i == 0 else 0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    return procs


def _step(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().startswith("touched")


def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


@pytest.mark.e2e
def test_summed_pss_counts_a_page_shared_by_two_processes_once(tmp_path):
    """Two processes touch the same 96 MiB of shared memory, one of them 64 MiB of its own: the summed PSS grows
    by 96 + 64 MiB (the reference: what was allocated), where the summed RSS grows by 2 x 96 + 64."""
    shared, private = 96, 64
    path = f"/dev/shm/cp-test-run-memory-{tmp_path.name}"
    with open(path, "wb") as f:
        f.truncate(shared * MIB)
    procs = []
    try:
        procs = _holders(path, 2, shared, private)
        pids = [p.pid for p in procs]
        before = sum(pss for _, _, pss in read_pss(pids))
        rss_before = _rss(pids)
        _step(procs)
        time.sleep(0.2)
        grown = (sum(pss for _, _, pss in read_pss(pids)) - before) / MIB
        rss_grown = (_rss(pids) - rss_before) / MIB
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        os.unlink(path)
    assert (shared + private) * 0.95 <= grown <= (shared + private) * 1.1, grown
    assert rss_grown >= (2 * shared + private) * 0.95  # RSS would count the shared pages twice


def test_a_device_actor_is_set_beside_the_bytes_the_model_charges_its_segment(tmp_path):
    """rounds.jsonl says which device k each pid was (device-pid-devices) and C7's bytes per device; the share
    is the actor's peak PSS less the largest bytes its device was charged in any round (figures by hand)."""
    rounds = [
        {"round": 1, "clients": {"0": {"device-pids": [11, 12], "device-pid-devices": [0, 2],
                                       "device-peak-bytes": [100 * MIB, 0.0, 50 * MIB]}}},
        {"round": 2, "clients": {"0": {"device-pids": [11, 12], "device-pid-devices": [0, 2],
                                       "device-peak-bytes": [80 * MIB, 0.0, 70 * MIB]}}},
    ]  # fmt: skip
    (tmp_path / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in rounds) + "\n")
    memory = RunMemory(every_s=1.0)
    memory.processes = {
        11: ProcessPeak("device actors", "ray::StageActor", 400 * MIB),
        12: ProcessPeak("device actors", "ray::StageActor", 300 * MIB),
        13: ProcessPeak("CU workers", "ray::ClientAppActor", 900 * MIB),
    }
    shares = device_shares(memory, tmp_path)
    assert shares == {
        "11": {"peak_pss_mib": 400.0, "c7_mib": 100.0, "above_c7_mib": 300.0},
        "12": {"peak_pss_mib": 300.0, "c7_mib": 70.0, "above_c7_mib": 230.0},
    }


@pytest.mark.e2e
def test_the_launcher_keeps_the_runs_memory_beside_its_status(tmp_path, monkeypatch):
    from tests.experiments.test_experiments_launch import FAKE_FLWR, fake_job

    fake = tmp_path / "fake_flwr"
    fake.write_text(FAKE_FLWR.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PIDFILE", str(tmp_path / "superlink.pid"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    status = launch(fake_job(tmp_path, {}), echo=None, flwr_exe=str(fake))
    kept = json.loads((tmp_path / "job" / MEMORY_FILE).read_text())
    assert status["ok"], status
    superlink = (tmp_path / "superlink.pid").read_text().strip()  # detached: found by its FLWR_HOME, not as a child
    assert kept["samples"] >= 2 and kept["peak_total_bytes"] == status["peak_pss_bytes"]
    assert kept["processes"][superlink]["peak_pss_bytes"] > 1 * MIB
    assert "peak memory" in status["memory"]
