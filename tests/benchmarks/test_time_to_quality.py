"""benchmarks/time_to_quality.py: the federated run's time to the central quality, against figures by hand."""

from __future__ import annotations

import json
import sys

import pytest

from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import time_to_quality as ttq  # noqa: E402


def _rounds() -> list[dict]:
    """Four rounds of 100 s each plus 10 s of evaluation on the evaluated ones (2 and 4)."""
    return [
        {"round": 1, "elapsed_s": 100.0, "measured_s": {"evaluate_s": 0.0}},
        {"round": 2, "elapsed_s": 210.0, "measured_s": {"evaluate_s": 10.0}, "val_bleu": 20.0},
        {"round": 3, "elapsed_s": 310.0, "measured_s": {"evaluate_s": 0.0}},
        {"round": 4, "elapsed_s": 420.0, "measured_s": {"evaluate_s": 10.0}, "val_bleu": 29.5},
    ]


def test_the_federated_time_leaves_evaluation_out_and_counts_flowers_start_up():
    status = {"wall_s": 450.0}  # 30 s before the ServerApp's first round and after its last
    side = ttq.federated_side(_rounds(), status, "bleu", target=29.0)
    assert side.reached_at == "round 4" and side.quality == 29.5
    assert side.seconds == pytest.approx(420.0 - 20.0 + 30.0)


def test_a_run_that_never_reaches_the_central_quality_is_censored():
    side = ttq.federated_side(_rounds(), {"wall_s": 450.0}, "bleu", target=31.0)
    assert side.seconds is None and side.quality == 29.5 and side.reached_at == "never"


def test_the_table_reads_kept_records_and_judges_the_ratio(tmp_path):
    folder = tmp_path / "records" / "translation"
    (folder / "federated").mkdir(parents=True)
    central = {"total_seconds": 400.0, "eval_seconds": 40.0, "steps": 1000, "val": {"bleu": 29.0}}
    (folder / "central.json").write_text(json.dumps(central))
    (folder / "federated" / "status.json").write_text(json.dumps({"wall_s": 450.0}))
    (folder / "federated" / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in _rounds()) + "\n")
    text = ttq.table(tmp_path / "records")
    row = next(line for line in text.splitlines() if line.startswith("| translation"))
    # federated 430 s against central 360 s: 1.19x, over the 1.1x target
    assert "| 360 |" in row and "| 430 |" in row and "1.19x" in row and row.endswith("| no |")
