"""The sweep of what killed processes leave in /dev/shm (collapipe_flwr/shm_leftovers.py), and the launcher's use
of it once a run's processes are stopped."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from collapipe_flwr import shm_leftovers
from collapipe_flwr.experiments.flwr_process import stop_and_clean
from collapipe_flwr.fl.dataplane import shm
from collapipe_flwr.pipeline.executors import shm_handoff


def dead_pid() -> int:
    """The pid of a process that has exited (reused within the test only after a pid wrap-around)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@pytest.mark.parametrize(
    ("name", "prefix", "pid"),
    [
        ("cpdp-123-0a1b", shm_leftovers.SEGMENT_PREFIX, 123),
        ("cpdp-0123456789123456", shm_leftovers.SEGMENT_PREFIX, None),  # a pre-pid name: 16 hex, here all digits
        ("cpdp-123-", shm_leftovers.SEGMENT_PREFIX, None),
        ("cpdp-x1-0a", shm_leftovers.SEGMENT_PREFIX, None),
        ("collapipe-handoff-77", shm_leftovers.HANDOFF_PREFIX, 77),
        ("collapipe-handoff-77-ab12cd34", shm_leftovers.HANDOFF_PREFIX, 77),
        ("collapipe-handoff-ab", shm_leftovers.HANDOFF_PREFIX, None),
        ("psm_123-ab", shm_leftovers.SEGMENT_PREFIX, None),
    ],
)
def test_the_creator_pid_is_read_from_the_name_only_where_the_name_carries_one(name, prefix, pid):
    assert shm_leftovers.creator_pid(name, prefix) == pid


@pytest.mark.e2e
def test_both_kinds_of_a_gone_process_are_removed_and_a_live_ones_kept(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    dead_segment, live_segment = tmp_path / shm.segment_name(dead), tmp_path / shm.segment_name(alive)
    dead_folder = tmp_path / f"{shm_handoff.FOLDER_PREFIX}{dead}-cafe0001"
    live_folder = tmp_path / f"{shm_handoff.FOLDER_PREFIX}{alive}"
    for segment in (dead_segment, live_segment):
        segment.write_bytes(b"frame")
    for folder in (dead_folder, live_folder):
        folder.mkdir()
        (folder / "t0").write_bytes(b"\0" * 64)  # a tensor nobody read
    (tmp_path / "unrelated").write_bytes(b"x")

    removed = shm_leftovers.remove_all_stale(tmp_path)

    assert removed == [dead_segment, dead_folder]
    assert sorted(tmp_path.iterdir()) == sorted([live_segment, live_folder, tmp_path / "unrelated"])
    assert (live_folder / "t0").exists()
    assert shm_leftovers.remove_all_stale(tmp_path) == []  # nothing stale is left


@pytest.mark.e2e
@pytest.mark.skipif(not shm_leftovers.SHM_DIR.is_dir(), reason="needs /dev/shm")
def test_the_launcher_sweeps_dev_shm_after_stopping_a_run(tmp_path):
    dead = dead_pid()
    segment = shm_leftovers.SHM_DIR / shm.segment_name(dead)
    folder = shm_leftovers.SHM_DIR / f"{shm_handoff.FOLDER_PREFIX}{dead}-0badc0de"
    segment.write_bytes(b"frame")
    folder.mkdir()
    (folder / "t0").write_bytes(b"x")
    try:
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        stop_and_clean(None, None, io.StringIO(), tmp_path / "flwr-home", scratch, tmp_path / "superlink.log")
        assert not segment.exists() and not folder.exists()
        assert not scratch.exists()
    finally:
        segment.unlink(missing_ok=True)
        if folder.exists():
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()
