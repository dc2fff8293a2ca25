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


def test_central_time_is_its_first_evaluation_at_its_final_quality():
    """A central run that reached its final BLEU at 300 s of training and then drifted: its time is 300 s, not its
    whole budget (520 s)."""
    history = [
        {"step": 100, "seconds": 100.0, "bleu": 20.0},
        {"step": 300, "seconds": 300.0, "bleu": 29.0},
        {"step": 500, "seconds": 500.0, "bleu": 28.5},
    ]
    record = {"steps": 520, "train_seconds": 520.0, "val": {"bleu": 29.0}, "val_history": history}
    side = ttq.central_side(record, "bleu")
    assert (side.quality, side.seconds, side.reached_at) == (29.0, 300.0, "step 300 of 520")
    record["val"] = {"bleu": 30.0}  # never reached before the end: all of its training
    assert ttq.central_side(record, "bleu").seconds == 520.0


def test_a_central_time_that_is_only_an_upper_bound_cannot_pass_the_target():
    old = ttq.central_side({"total_seconds": 400.0, "eval_seconds": 40.0, "steps": 1000, "val": {"bleu": 29.0}}, "bleu")
    assert old.seconds == 360.0 and old.reached_at.endswith("upper bound")
    assert ttq.verdict(0.47, old).startswith("undecided") and ttq.verdict(1.2, old) == "no"
    new = ttq.Side(29.0, 360.0, "step 900 of 1000")
    assert ttq.verdict(0.47, new) == "yes" and ttq.verdict(1.2, new) == "no"
