"""Kept campaign jobs run again: partial reruns (``results/rerun_check.py``), their training set round by round
beside the kept job's and their devices' virtual compute plan by plan; and jobs run twice, the first superseded
(``clock_consistency.run_twice``)."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from tests.results_scripts import RESULTS, load


def _gz_rounds(path, rounds):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rounds)


def test_a_rerun_is_set_round_by_round_beside_its_kept_job_and_a_changed_plan_shows(tmp_path):
    """A kept translation job of two rounds and a rerun whose round-2 plan differs (S = 2, not 1): the table gives
    both runs' losses and BLEU as written, "yes" for round 1's plan and "no" for round 2's; the committed table is
    what the kept reruns give."""
    check = load("rerun_check")
    plan = {"clusters": [{"cluster": 0, "S": 1, "m": 1}]}
    kept = [{"round": 0}, *({"round": t, "train_loss": 9.0 - t, "val_bleu": 0.5 * t, "plan": plan} for t in (1, 2))]
    rerun = [
        {"round": 1, "train_loss": 7.99991, "val_bleu": 0.5, "plan": plan},
        {"round": 2, "train_loss": 7.1, "val_bleu": 1.25, "plan": {"clusters": [{"cluster": 0, "S": 2, "m": 1}]}},
    ]
    _gz_rounds(tmp_path / "records" / "paper" / "j4" / "s0" / "dssra.rounds.jsonl.gz", kept)
    (tmp_path / "records" / "paper" / "j4" / "s0" / "dssra.status.json").write_text(json.dumps({"overrides": []}))
    _gz_rounds(tmp_path / "reruns" / "paper" / "j4" / "s0" / "dssra.a.rounds.jsonl.gz", rerun)
    lines = check.table(tmp_path / "reruns", tmp_path / "records").splitlines()
    assert "## paper j4 s0 dssra" in lines
    assert "| 1 | 8.0000 | 0.500 | 7.9999 | 0.500 | yes |" in lines
    assert "| 2 | 7.0000 | 1.000 | 7.1000 | 1.250 | no |" in lines
    assert check.table() == (RESULTS / "virtual_paper" / "reruns.md").read_text(encoding="utf-8")


def _timed_round(t, compute, host_flops, plans):
    """A trained round whose clock wrote its host speed: per selected cluster its plan and its devices' compute."""
    clusters = {str(n): {"compute_s": compute[n]} for n in compute}
    return {
        "round": t,
        "train_loss": 5.0,
        "val_f1": 0.1,
        "plan": {"clusters": [{"cluster": n, "S": s, "m": m, "delta": [6], "selected": True} for n, s, m in plans]},
        "virtual": {"clusters": clusters, "host_flops": host_flops, "server_scale": 1.0},
    }


def test_a_reruns_clock_is_set_beside_its_kept_jobs_plan_by_plan(tmp_path):
    """The devices' compute of the same plan in a kept NER job and its rerun: plan (cluster 0, S 1, m 1) reads 10 s
    in the kept job's rounds and 12 s in the rerun's (1.200 by hand), plan (cluster 1, S 2, m 4) 20 s and 19 s
    (0.950); a plan the rerun ran in only two rounds is left out. Median 1.075, range 0.950-1.200, and the host
    speeds the clocks wrote (90e9 and 80e9)."""
    check = load("rerun_check")
    plans = [(0, 1, 1), (1, 2, 4)]
    kept = [{"round": 0}, *(_timed_round(t, {0: 10.0, 1: 20.0}, 90e9, plans) for t in (1, 2, 3, 4))]
    rerun = [_timed_round(t, {0: 12.0, 1: 19.0}, 80e9, plans) for t in (1, 2, 3)]
    rerun.append(_timed_round(4, {0: 11.0, 1: 30.0}, 80e9, [(0, 1, 1), (1, 3, 4)]))  # (1, 3, 4): one round only
    kept_dir = tmp_path / "records" / "ner" / "j4" / "s1"
    _gz_rounds(kept_dir / "titanic.rounds.jsonl.gz", kept)
    (kept_dir / "titanic.status.json").write_text(json.dumps({"overrides": ["task=ner"]}))
    _gz_rounds(tmp_path / "reruns" / "ner" / "j4" / "s1" / "titanic.again.rounds.jsonl.gz", rerun)
    lines = check.table(tmp_path / "reruns", tmp_path / "records").splitlines()
    assert "| again | 2 | 1.075 | 0.950 | 1.200 | 90.0 | 80.0 |" in lines


def test_a_job_run_twice_is_read_plan_by_plan_against_its_superseded_first_run(tmp_path):
    """A NER job first run on a host its clock read at 100e9 (plan (cluster 0, S 1, m 1): 10 virtual s), kept in
    superseded/host_off/, and run again at 90e9 (8.1 s): by hand the compute ratio 0.81, the CPU seconds' (8.1 / 90e9
    over 10 / 100e9) 0.9 and the host's 0.9. Its round 4 planned m = 2: one round of another plan, so 3 of 4 rounds
    share their plan and one plan is compared. A superseded job with no kept replacement pairs with none."""
    clock = load("clock_consistency")
    first = [_timed_round(t, {0: 10.0}, 100e9, [(0, 1, 1)]) for t in (1, 2, 3, 4)]
    again = [_timed_round(t, {0: 8.1}, 90e9, [(0, 1, 1)]) for t in (1, 2, 3)]
    again.append(_timed_round(4, {0: 5.0}, 90e9, [(0, 1, 2)]))
    for folder, run, rounds in (
        ("superseded/host_off/ner/j4/s1", "random", first),
        ("ner/j4/s1", "random", again),
        ("superseded/host_off/ner/j4/s2", "titanic", first),
    ):
        _gz_rounds(tmp_path / folder / f"{run}.rounds.jsonl.gz", rounds)
        (tmp_path / folder / f"{run}.status.json").write_text(json.dumps({"overrides": []}))
    (got,) = clock.run_twice(tmp_path)
    assert (got["part"], got["seed"], got["run"], got["same_plans"], got["rounds"], got["plans"]) == (
        "ner",
        "1",
        "random",
        3,
        4,
        1,
    )
    assert (
        got["compute"] == pytest.approx(0.81) and got["cpu"] == pytest.approx(0.9) and got["host"] == pytest.approx(0.9)
    )
    assert math.isnan(got["to_target"])  # F1 0.1 throughout: neither run reached 0.16, no ratio


def test_a_job_run_twice_sets_its_time_to_target_against_the_first_runs(tmp_path):
    """The first run's rounds last 100 virtual s and its F1 reaches the NER target 0.16 in round 2 (200 s); the
    second's last 110 and 130 s and reach it in round 2 too (240 s): by hand 240 / 200 = 1.2."""
    clock = load("clock_consistency")
    runs = {"superseded/host_off/ner/j4/s0": (100.0, 100.0), "ner/j4/s0": (110.0, 130.0)}
    for folder, seconds in runs.items():
        rounds = [_timed_round(t, {0: 10.0}, 90e9, [(0, 1, 1)]) for t in (1, 2, 3)]
        for record, f1, round_s in zip(rounds, (0.1, 0.2, 0.3), (*seconds, 50.0)):
            record["val_f1"], record["virtual"]["round_s"] = f1, round_s
        _gz_rounds(tmp_path / folder / "dssra.rounds.jsonl.gz", rounds)
        (tmp_path / folder / "dssra.status.json").write_text(json.dumps({"overrides": []}))
    (got,) = clock.run_twice(tmp_path)
    assert got["to_target"] == pytest.approx(1.2)
