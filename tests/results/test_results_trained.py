"""results/trained_learning.py: the campaign's job list and order, and that finished jobs are never rerun."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

RESULTS = ROOT / "results"


@pytest.fixture
def trained(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(RESULTS))
    spec = importlib.util.spec_from_file_location("trained_learning", RESULTS / "trained_learning.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "trained_learning", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RECORDS", tmp_path / "kept")  # never the repository's own records
    yield module
    sys.modules.pop("campaign", None)


def test_seed_0_of_every_task_and_method_comes_first_and_every_job_is_named_once(trained):
    names = [job.name for job in trained.jobs()]
    assert len(names) == len(set(names)) == 3 * 3 * 5 + 3 + 3 + 2 * 5
    first = names[:15]
    assert names[15:18] == [f"{task}/central/seed0" for task in trained.TASKS]  # the references, after seed 0
    assert first[0] == "translation/methods/seed0/collapipe"
    assert {n.split("/")[2] for n in first} == {"seed0"} and {n.split("/")[0] for n in first} == set(trained.TASKS)
    grid = [job for job in trained.jobs() if "/grid/" in job.name]
    assert {j.task for j in grid} == {"translation", "ner"}
    assert all("method=collapipe_no_ss" in j.overrides and "federation=long" in j.overrides for j in grid)
    assert all("decoder_update=ordered runtime.seeded_dropout=true" in j.overrides for j in grid)  # learning alone


def fake_run(root: Path, name: str, wall_s: float) -> None:
    """What a finished ``collapipe run`` leaves in its run folder (the records, plus a model the records omit)."""
    folder = root / name
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "weights.safetensors").write_bytes(b"w" * 64)
    (folder / "config.json").write_text(json.dumps({"seed": 0}))
    (folder / "rounds.jsonl").write_text(json.dumps({"round": 1, "train_loss": 5.0}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"wall_s": wall_s}))


def record_runs(trained, monkeypatch, wall_s: float = 300.0) -> list[str]:
    """Stand in for ``collapipe run``: each job leaves a finished run folder (:func:`fake_run`) and its name in the
    returned list; the report is skipped."""
    ran: list[str] = []

    def run_job(root, name, overrides, flat=""):
        ran.append(name)
        fake_run(root, name, wall_s)
        return True

    monkeypatch.setattr(trained.campaign, "run_job", run_job)
    monkeypatch.setattr(trained, "report", lambda records: 0)
    return ran


def test_finished_jobs_are_skipped_and_a_rerun_with_everything_done_runs_nothing(trained, tmp_path, monkeypatch):
    ran, reported = [], []

    def run_job(root, name, overrides, flat=""):
        ran.append(name)
        fake_run(root, name, 300.0)
        return True

    monkeypatch.setattr(trained.campaign, "run_job", run_job)
    monkeypatch.setattr(trained, "report", lambda records: reported.append(records) or 0)
    root = tmp_path / "root"
    piece = "translation/methods/seed0"
    done = root / piece / "collapipe"
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"wall_s": 360.0}))
    assert trained.main([str(root), "--only", piece]) == 0
    assert ran == [f"{piece}/{m}" for m in trained.METHODS if m != "collapipe"]
    ran.clear()  # the piece finished: a rerun starts no job
    assert trained.main([str(root), "--only", piece]) == 0
    assert ran == [] and len(reported) == 2


def test_the_kept_records_alone_resume_the_campaign_on_another_machine(trained, tmp_path, monkeypatch, capsys):
    ran = record_runs(trained, monkeypatch)
    piece = "translation/methods/seed0"
    assert trained.main([str(tmp_path / "first_machine"), "--only", piece]) == 0
    kept = trained.RECORDS / piece / "vanilla_fl"
    assert sorted(p.name for p in kept.iterdir()) == ["config.json", "rounds.jsonl", "summary.json"]  # no model
    assert (kept / "rounds.jsonl").read_text() == json.dumps({"round": 1, "train_loss": 5.0}) + "\n"
    ran.clear()
    capsys.readouterr()
    # A fresh clone elsewhere: the run folders are gone, the records came with the repository.
    assert trained.main([str(tmp_path / "second_machine"), "--only", piece]) == 0
    assert ran == [] and "5 of 5 jobs done (0.4 h of runs)" in capsys.readouterr().out


def test_a_run_that_finished_but_was_not_kept_yet_is_kept_not_rerun(trained, tmp_path, monkeypatch):
    monkeypatch.setattr(trained.campaign, "run_job", lambda *a, **k: pytest.fail("a finished run was started again"))
    root = tmp_path / "root"
    name = "ner/grid/S2_m2"
    fake_run(root, name, 120.0)
    assert trained.main([str(root), "--status", "--only", name]) == 0
    assert json.loads((trained.RECORDS / name / "summary.json").read_text()) == {"wall_s": 120.0}
    assert not list((trained.RECORDS / name).glob("*.part"))


def test_status_prints_done_and_left_and_an_unknown_prefix_is_an_error(trained, tmp_path, capsys):
    assert trained.main([str(tmp_path), "--status", "--only", "ner/grid"]) == 0
    out = capsys.readouterr().out
    assert "left  ner/grid/S2_m2" in out and "0 of 5 jobs done" in out
    assert trained.main([str(tmp_path), "--only", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: no job name starts with 'nope'")


def test_a_central_job_runs_the_central_recipe_and_keeps_its_record(trained, tmp_path, monkeypatch):
    calls = []

    def call(cmd, cwd, stdout, stderr):
        calls.append(cmd)
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"steps": 1571, "val": {"bleu": 30.0}}))
        return 0

    monkeypatch.setattr(trained.subprocess, "call", call)
    monkeypatch.setattr(trained, "report", lambda records: 0)
    root = tmp_path / "root"
    assert trained.main([str(root), "--only", "translation/central"]) == 0
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "collapipe_flwr.apps.train_central", "task=translation"]
    assert "model.optimizer.lr=0.002" in cmd and cmd[cmd.index("--max-steps") + 1] == "1571"
    kept = trained.RECORDS / "translation/central/seed0"
    assert json.loads((kept / "central.json").read_text())["val"] == {"bleu": 30.0}
    calls.clear()
    assert trained.main([str(root), "--only", "translation/central"]) == 0 and calls == []


def test_a_stop_file_ends_the_piece_before_its_next_job(trained, tmp_path, monkeypatch):
    root = tmp_path / "root"
    ran = []

    def run_job(root_, name, overrides, flat=""):
        ran.append(name)
        fake_run(root_, name, 10.0)
        (root_ / "STOP").touch()  # asked while this job runs
        return True

    monkeypatch.setattr(trained.campaign, "run_job", run_job)
    monkeypatch.setattr(trained, "report", lambda records: 0)
    assert trained.main([str(root), "--only", "translation/methods/seed0"]) == 0
    assert ran == ["translation/methods/seed0/collapipe"] and not (root / "STOP").exists()


def test_jobs_limits_the_piece_to_the_first_jobs_left(trained, tmp_path, monkeypatch, capsys):
    root = tmp_path / "root"
    ran = record_runs(trained, monkeypatch, 10.0)
    # "collapipe" is a prefix of "collapipe_no_ss" too: --jobs 1 takes only the first
    assert trained.main([str(root), "--only", "translation/methods/seed0/collapipe", "--jobs", "1"]) == 0
    assert ran == ["translation/methods/seed0/collapipe"]
    assert trained.main([str(root), "--only", "translation/methods/seed0/collapipe", "--jobs", "1"]) == 0
    assert ran == ["translation/methods/seed0/collapipe", "translation/methods/seed0/collapipe_no_ss"]
    assert trained.main([str(root), "--only", "translation", "--jobs", "-1"]) == 2
    assert "--jobs -1 must be >= 0" in capsys.readouterr().err
