"""results/fig6_learning.py: the paired per-seed gaps and the gradient-exact loss comparison, by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "results" / "fig6_learning.py"


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("fig6_learning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(method, seed, final, loss):
    present = [v for v in loss if v is not None]
    return {
        "method": method,
        "seed": seed,
        "final_metric": final,
        "loss": loss,
        "early_loss": sum(present) / len(present),
    }


def test_gaps_are_paired_by_seed_and_skip_unmatched_seeds(learning):
    by_method = {
        "collapipe": [
            run("collapipe", 0, 0.50, [2.0]),
            run("collapipe", 1, 0.40, [2.0]),
            run("collapipe", 2, 0.9, [1.0]),
        ],
        "pipeline": [run("pipeline", 1, 0.30, [3.0]), run("pipeline", 0, 0.45, [1.0])],  # no seed 2, out of order
    }
    assert learning.paired_gaps(by_method, "pipeline", "final_metric") == pytest.approx([0.05, 0.10])
    assert learning.paired_gaps(by_method, "pipeline", "early_loss") == pytest.approx([1.0, -1.0])
    assert learning.paired_gaps(by_method, "titanic", "final_metric") == []


def test_loss_difference_compares_the_same_seed_and_round_only(learning):
    by_method = {
        "collapipe": [run("collapipe", 0, 0.5, [3.0, 2.0, 1.0]), run("collapipe", 1, 0.5, [5.0, 4.0, None])],
        "titanic": [run("titanic", 1, 0.5, [5.0, 4.5, 0.0]), run("titanic", 0, 0.5, [3.0, 2.25, 1.0])],
    }
    # seed 0: |2 - 2.25| = 0.25; seed 1: |4 - 4.5| = 0.5, round 3 has no CollaPipe loss; never seed 0 vs seed 1
    assert learning.max_loss_difference(by_method, "titanic") == pytest.approx(0.5)
    assert learning.max_loss_difference(by_method, "collapipe_no_ss") is None


def test_mean_sd_of_one_value_has_no_spread(learning):
    assert learning.mean_sd([2.0]) == (2.0, 0.0)
    mean, sd = learning.mean_sd([1.0, 3.0])
    assert (mean, sd) == pytest.approx((2.0, 2**0.5))


def test_repeat_section_pairs_collapipe_runs_of_the_same_seed(learning):
    first = dict(run("collapipe", 0, 0.50, [3.0, 2.0]), ok=True)
    other_seed = dict(run("collapipe", 1, 0.10, [9.0, 9.0]), ok=True)
    again = dict(run("collapipe", 0, 0.45, [3.0, 2.5]), ok=True)
    figures: dict = {}
    lines = learning.repeat_section("translation", [first, other_seed], [again], figures)
    assert figures["translation_repeat_seed0_max_loss_diff"] == pytest.approx(0.5)  # |2.0 - 2.5|, never seed 1
    assert figures["translation_repeat_seed0_metric_diff"] == pytest.approx(0.05)
    assert any(line.startswith("| 0 | 5.00e-01 | 0.5000 | 0.4500 | +0.0500 |") for line in lines)
    assert learning.repeat_section("translation", [first], [], {}) == []
