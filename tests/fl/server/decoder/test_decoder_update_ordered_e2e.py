"""End to end: two `collapipe run` smoke runs with ``federation.decoder_update=ordered`` and
``runtime.seeded_dropout=true`` and the same seed log the same training losses in their rounds.jsonl (per CU and
step), with dropout on and the data plane over sockets, however their CUs' steps reached the decoder.

Without ``seeded_dropout`` the device stages' dropout masks are not drawn from the run's seed, which alone makes
two runs differ (measured: 1.4e-3 in CU 0's first loss, before any decoder update); without ``ordered`` two runs
differ by the order in which their CUs' steps reached the decoder (measured with dropout 0: round 1's loss 0.034
apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flower_env import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _smoke_run(data_dir: Path, out: Path, name: str) -> list[dict]:
    env = dict(os.environ, COLLAPIPE_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    overrides = (
        f"federation.decoder_update=ordered runtime.seeded_dropout=true dataplane.transport=socket run_name={name}"
    )
    cmd = [
        str(Path(sys.executable).parent / "collapipe"),
        "run",
        "--run-config",
        "preset='smoke'",
        "--run-config",
        f'overrides="{overrides}"',
        "--run-config",
        f'output-dir="{out}"',
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (out / name / "rounds.jsonl").read_text().splitlines()]


def test_two_ordered_smoke_runs_log_identical_training_losses(data_dir, tmp_path):
    first, second = (_smoke_run(data_dir, tmp_path, name) for name in ("a", "b"))
    trained = [r for r in first if r["round"] >= 1]
    assert [r["round"] for r in trained] == [1, 2]
    for a, b in zip(first, second, strict=True):
        assert a["round"] == b["round"] and a.get("train_loss") == b.get("train_loss")
        for cluster, stats in a.get("clients", {}).items():
            assert stats["train-losses"] == b["clients"][cluster]["train-losses"], (a["round"], cluster)
