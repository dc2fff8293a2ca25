"""results/convergence.py: rounds to 90% of the loss's drop, by hand on built curves and on the kept records."""

from __future__ import annotations

import json

import pytest

from tests.paths import ROOT
from tests.results_scripts import load


def _module():
    return load("convergence")


def test_a_steady_fall_converges_late_and_a_fast_one_early():
    conv = _module()
    rounds = list(range(1, 31))
    steady = [30.0 - r for r in rounds]  # L_1 = 29, last five mean 2: 90% of the drop at 29 - 24.3 = 4.7, round 26
    assert conv.rounds_to_converge(rounds, steady) == 26
    fast = [10.0 if r == 1 else 1.0 + 0.01 * (30 - r) for r in rounds]  # at ~1.0 from round 2 on
    assert conv.rounds_to_converge(rounds, fast) == 2


def test_too_short_a_run_is_refused():
    with pytest.raises(ValueError, match="more than 5 rounds"):
        _module().rounds_to_converge([1, 2, 3], [3.0, 2.0, 1.0])


def test_the_ceiling_verdict_can_fail_and_can_pass():
    conv = _module()
    assert conv.verdict([14, 15, 13]) == "reproduced"  # meets "within 15"
    assert conv.verdict([26, 27, 26]) == "not reproduced"  # 26.3 rounds, more than 25% over, interval far from 15
    assert conv.verdict([18, 18, 18.5]) == "reproduced"  # 18.2 is within 25% of 15


def test_the_classification_records_by_hand():
    """Seed by seed, r_90 recomputed here from the kept rounds.jsonl, without the module's helpers."""
    expected = []
    for seed in (0, 1, 2):
        path = ROOT / "results/trained/jobs/classification/methods" / f"seed{seed}" / "collapipe" / "rounds.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        points = [(r["round"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
        first, end = points[0][1], sum(loss for _, loss in points[-5:]) / 5
        expected.append(min(r for r, loss in points if loss <= first - 0.9 * (first - end)))
    assert _module().collapipe_rounds("classification") == expected
