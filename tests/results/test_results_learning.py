"""results/fig6_learning.py: the paired per-seed gaps and the gradient-exact loss comparison, by hand."""

from __future__ import annotations

import importlib.util

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "results" / "fig6_learning.py"


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


def test_a_margin_is_outside_the_noise_only_when_its_confidence_interval_excludes_zero_and_it_beats_the_floor(
    learning,
):
    # gaps 10, 12, 11: mean 11, sd 1; Student's t(0.975, 2) = 4.3027, so the 95% half-width is 4.3027 / sqrt(3)
    assert learning.margin_verdict([10.0, 12.0, 11.0], None) == "outside the noise (95% CI +- 2.48)"
    assert learning.margin_verdict([10.0, 12.0, 11.0], 12.0).startswith("within")  # the same seed differs more
    assert learning.margin_verdict([1.0, -1.0, 0.5], None).startswith("within")
    assert learning.margin_verdict([3.0], None) == "one seed: no spread yet"


def test_margins_are_relative_gaps_for_the_metric_and_the_floor_comes_from_the_same_seed_repeat(learning):
    ours = [dict(run("collapipe", s, v, [5.0]), ok=True) for s, v in ((0, 30.0), (1, 28.0), (2, 29.0))]
    base = [dict(run("pipeline", s, v, [6.0]), ok=True) for s, v in ((0, 25.0), (1, 25.0), (2, 25.0))]
    again = [dict(run("collapipe", 0, 29.4, [5.0]), ok=True)]
    figures: dict = {}
    lines = learning.margins_section("translation", ours + base, again, figures)
    # paired relative gaps 100 * (30 - 25) / 25 = 20, 12, 16: mean 16; the floor |30 - 29.4| / 30 = 2%
    assert figures["translation_margin_final_metric_vs_pipeline"] == pytest.approx(16.0)
    row = next(line for line in lines if line.startswith("| Fig. 6d") and "| pipeline |" in line)
    assert "| 2% |" in row and "outside the noise" in row
    assert any("| titanic | not run |" in line for line in lines)
    early = next(line for line in lines if line.startswith("| Fig. 6a") and "| pipeline |" in line)
    assert "-1.000 +- 0.000 (n=3)" in early  # loss 5 - 6 per seed, absolute


def test_the_central_reference_sets_each_methods_mean_beside_it(learning):
    methods = [dict(run("collapipe", s, v, [5.0]), ok=True, metric="bleu") for s, v in ((0, 27.0), (1, 29.0))]
    central = {"steps": 1571, "train_seconds": 800.0, "seed": 0, "val": {"bleu": 30.0}}
    figures: dict = {}
    lines = learning.central_section("translation", central, methods, figures)
    assert figures["translation_over_central_collapipe"] == pytest.approx(28.0 / 30.0)
    assert "**bleu 30.0000**" in lines[0] and "collapipe 0.933x" in lines[0]
    assert learning.central_section("translation", None, methods, {}) == []


def grid_point(S, m, final, early, method="collapipe_no_ss", seed=0):
    return {
        "ok": True,
        "S": S,
        "m": m,
        "metric": "bleu",
        "final_metric": final,
        "early_loss": early,
        "method": method,
        "seed": seed,
    }


def test_grid_claims_name_the_best_point_and_the_m_gaps_against_the_methods_seed_spread(learning):
    grid = [
        grid_point(1, 1, 30.0, 3.0),
        grid_point(1, 4, 29.0, 3.2),
        grid_point(2, 2, 29.9, 3.1),
        grid_point(3, 1, 28.0, 3.4),
        grid_point(3, 4, 28.05, 3.35),
    ]
    # the grid's method at three seeds: BLEU sd = 0.2 (29.8, 30.0, 30.2), early-loss sd = 0.01
    methods = [
        grid_point(None, None, b, e, seed=s) for s, (b, e) in enumerate(((29.8, 3.0), (30.0, 3.01), (30.2, 3.02)))
    ]
    methods.append(grid_point(None, None, 10.0, 9.0, method="vanilla_fl"))  # another method: not the grid's noise
    figures = {}
    lines = learning.grid_claims_section("translation", grid, methods, figures)
    fig9 = next(line for line in lines if line.startswith("| Fig. 9"))
    assert "best bleu 30 at (1, 1)" in fig9 and "(2, 2) is not best" in fig9 and "within the seed sd" in fig9
    assert figures["translation_grid_S2_m2_gap_to_best"] == pytest.approx(-0.1)
    s1, s3 = (line for line in lines if line.startswith("| Fig. 10"))
    # S = 1: BLEU +1.0 (> 0.2: larger), loss -0.2 (the paper's sign, > 0.01: larger)
    assert "bleu: the paper's sign, larger than the seed sd" in s1 and "early loss: the paper's sign, larger" in s1
    # S = 3: BLEU -0.05 (wrong sign, within), loss +0.05 (wrong sign, larger than 0.01)
    assert "bleu: not the paper's sign, within the seed sd" in s3
    assert "early loss: not the paper's sign, larger than the seed sd" in s3
    assert figures["translation_grid_S3_m1_minus_m4_bleu"] == pytest.approx(-0.05)


def test_grid_claims_without_a_seed_spread_say_so_and_without_points_say_nothing(learning):
    grid = [grid_point(1, 1, 1.0, 2.0), grid_point(1, 4, 0.5, 2.5), grid_point(2, 2, 1.0, 2.1)]
    lines = learning.grid_claims_section("ner", grid, [grid_point(None, None, 1.0, 2.0)], {})
    assert any("(2, 2) is best" in line for line in lines)  # a tie with (1, 1) counts as best
    assert any("no seed spread to judge it against" in line for line in lines)
    assert learning.grid_claims_section("ner", [], [], {}) == []
