"""evaluate: a model saved by train_central --save gives back the validation metric train_central printed."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from collapipe_flwr.apps import evaluate, train_central
from tests.central_runs import tiny_classification_args


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """train_central on classification/bert_tiny for 3 steps, saved with --save; (folder, summary, printed line)."""
    folder = tmp_path_factory.mktemp("run")
    out = io.StringIO()
    quiet = contextlib.redirect_stderr(io.StringIO())
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), quiet:
        patch.setenv("COLLAPIPE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        summary = train_central.main([*tiny_classification_args(data_dir, 64), "--save", str(folder)])
    return folder, summary, out.getvalue().strip().splitlines()[-1]


def test_save_writes_the_model_store_format(trained):
    folder, summary, _ = trained
    meta = json.loads((folder / "model" / "model.json").read_text())
    assert meta["info"]["saved_by"] == "train_central" and meta["info"]["steps"] == summary["steps"] == 3
    assert meta["info"]["precision"] in ("fp32", "bf16")
    assert meta["config"]["eval"]["max_examples"] == 32


def test_evaluate_reproduces_the_printed_metric(trained, data_dir, tmp_path, capsys):
    folder, summary, printed = trained
    metrics = evaluate.main([str(folder), "--data-dir", str(data_dir), "--json", str(tmp_path / "e.json")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == printed and printed.startswith("accuracy: ")
    assert metrics["accuracy"] == summary["val"]["accuracy"]
    assert metrics["loss"] == pytest.approx(summary["val"]["loss"], rel=1e-6)
    assert metrics["examples"] == 32.0
    assert json.loads((tmp_path / "e.json").read_text())["metrics"]["accuracy"] == metrics["accuracy"]


def test_flags_override_the_saved_eval_settings(trained, capsys):
    folder, _, _ = trained
    metrics = evaluate.main([str(folder / "model"), "--max-examples", "8", "--batch-size", "4", "--precision", "fp32"])
    assert metrics["examples"] == 8.0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("accuracy: ")


def test_the_saved_eval_precision_is_the_default(trained, data_dir, tmp_path):
    """eval.precision (when not ``runtime``) decides the precision of a saved run's evaluation, before its
    runtime.precision; train_central records what its final evaluation ran under."""
    folder, summary, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(folder, copy)
    meta_file = copy / "model" / "model.json"
    meta = json.loads(meta_file.read_text())
    assert summary["eval_precision"] == meta["info"]["precision"]  # eval.precision=runtime: the training's
    meta["config"]["runtime"]["precision"] = "bf16"
    meta["config"]["eval"]["precision"] = "fp32"
    meta_file.write_text(json.dumps(meta))
    evaluate.main([str(copy), "--data-dir", str(data_dir), "--max-examples", "4", "--json", str(tmp_path / "e.json")])
    assert json.loads((tmp_path / "e.json").read_text())["precision"] == "fp32"


def test_missing_folder_is_one_line_and_nonzero(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(tmp_path / "nowhere")])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model folder") and "does not exist" in err[0]


def test_unnamed_test_split_says_which_keys_to_set(trained, capsys):
    folder, _, _ = trained
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main([str(folder), "--split", "test"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task.test_file=<file>" in err[0]


def test_task_overrides_name_a_test_split(trained, capsys):
    folder, summary, printed = trained
    metrics = evaluate.main([str(folder), "task.test_file=toutiao/val.txt", "--split", "test"])
    assert metrics["accuracy"] == summary["val"]["accuracy"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == printed
    with pytest.raises(SystemExit):
        evaluate.main([str(folder), "model.hidden=8"])
    assert capsys.readouterr().err.strip().startswith("error: override 'model.hidden=8' is not task.<key>=<value>")
