"""The launcher's small state files (status.json, run_config.toml) are replaced in one step: a disk that fills
up mid-write leaves the previous file whole, never a 0-byte or half-written one (issue 67: ``write_status``
was a plain ``write_text``, which empties the file before it writes).

The full disk is real: a child process whose files cannot grow past a few bytes (RLIMIT_FSIZE; a write past the
limit fails with EFBIG, as on a full disk), so every write fails midway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

STATUS_DRIVER = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from collapipe_flwr.errors import CollaPipeError
    from collapipe_flwr.experiments.job_status import write_status
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    try:
        write_status(Path(sys.argv[1]), {"ok": True, "error": "", "note": "x" * 200})
    except CollaPipeError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    """
)

CLI_DRIVER = textwrap.dedent(
    """
    import resource, signal, sys, tempfile
    import torch  # imported (and Python's temp folder probed) while files can still grow
    from collapipe_flwr.apps.cli import main
    from collapipe_flwr.experiments import launch
    tempfile.gettempdir()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
    sys.exit(main(sys.argv[2:]))
    """
)


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(cwd / "tmp")}
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_status_json_write_that_fails_midway_keeps_the_old_file(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    old = json.dumps({"ok": False, "error": "the earlier attempt's"}, indent=2)
    (job / "status.json").write_text(old)
    proc = _run([STATUS_DRIVER, str(job), "40"], tmp_path)  # 40 bytes in, the disk is full
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write") and "status.json" in lines[0], lines
    assert (job / "status.json").read_text() == old
    assert _leftovers(job) == []


def test_a_full_disk_at_start_keeps_the_run_folders_status_and_run_config(tmp_path, data_dir):
    """`collapipe run` on a disk that fills up 64 bytes into any file: one line naming run_config.toml, exit 1,
    and the folder's earlier status.json and run_config.toml (a failed attempt's) are as they were."""
    folder = tmp_path / "runs" / "full"
    folder.mkdir(parents=True)
    old_status = json.dumps({"ok": False, "error": "the earlier attempt's", "note": "y" * 100}, indent=2)
    old_config = "# the earlier attempt's run config\n" + "# padding\n" * 20
    (folder / "status.json").write_text(old_status)
    (folder / "run_config.toml").write_text(old_config)
    run_config = f"run-name='full' data-dir='{data_dir}'"
    proc = _run([CLI_DRIVER, "64", "run", "--run-config", run_config], tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write") and "run_config.toml" in lines[0], lines
    assert (folder / "run_config.toml").read_text() == old_config
    assert (folder / "status.json").read_text() == old_status
    assert _leftovers(folder) == [] and list((tmp_path / "tmp").iterdir()) == []
