"""results/trained_learning.py: the campaign's job list and order, and that finished jobs are never rerun."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.fixture
def trained(monkeypatch):
    monkeypatch.syspath_prepend(str(RESULTS))
    spec = importlib.util.spec_from_file_location("trained_learning", RESULTS / "trained_learning.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "trained_learning", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("campaign", None)


def test_seed_0_of_every_task_and_method_comes_first_and_every_job_is_named_once(trained):
    names = [job.name for job in trained.jobs()]
    assert len(names) == len(set(names)) == 3 * 3 * 5 + 1 + 2 * 5
    first = names[:15]
    assert first[0] == "translation/methods/seed0/collapipe"
    assert {n.split("/")[2] for n in first} == {"seed0"} and {n.split("/")[0] for n in first} == set(trained.TASKS)
    grid = [job for job in trained.jobs() if "/grid/" in job.name]
    assert {j.task for j in grid} == {"translation", "ner"}
    assert all("method=collapipe_no_ss" in j.overrides and "federation=long" in j.overrides for j in grid)


def test_finished_jobs_are_skipped_and_a_rerun_with_everything_done_runs_nothing(trained, tmp_path, monkeypatch):
    ran, reported = [], []
    monkeypatch.setattr(trained.campaign, "run_job", lambda root, name, overrides, flat="": ran.append(name) or True)
    monkeypatch.setattr(trained, "report", lambda root: reported.append(root) or 0)
    piece = "translation/methods/seed0"
    done = tmp_path / piece / "collapipe"
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"wall_s": 360.0}))
    assert trained.main([str(tmp_path), "--only", piece]) == 0
    assert ran == [f"{piece}/{m}" for m in trained.METHODS if m != "collapipe"]
    for name in ran:  # the piece finished: a rerun starts no job
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "summary.json").write_text(json.dumps({"wall_s": 300.0}))
    ran.clear()
    assert trained.main([str(tmp_path), "--only", piece]) == 0
    assert ran == [] and len(reported) == 2


def test_status_prints_done_and_left_and_an_unknown_prefix_is_an_error(trained, tmp_path, capsys):
    assert trained.main([str(tmp_path), "--status", "--only", "ner/grid"]) == 0
    out = capsys.readouterr().out
    assert "left  ner/grid/S2_m2" in out and "0 of 5 jobs done" in out
    assert trained.main([str(tmp_path), "--only", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: no job name starts with 'nope'")
