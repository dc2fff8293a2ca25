"""Short central training on slices of the real data (tiny models): the loss goes down, the CLI's last
line is the validation metric, the lr schedule has the documented shape."""

from __future__ import annotations

import math

import pytest
import torch

from collapipe_flwr.tasks.lr_schedule import lr_factor
from collapipe_flwr.tasks.registry import build_task
from tests.central_runs import tiny_classification_args
from tests.task_specs import specs


def _train(task, indices, steps, seed=0):
    torch.manual_seed(seed)
    model = task.build_model(seed)
    params = [p for part in (model.embedding, model.blocks, model.head) for p in part.parameters()]
    opt = task.model_spec.optimizer.build(params)
    losses = []
    while len(losses) < steps:
        for batch in task.batches(indices, 16, seed=len(losses)):
            opt.zero_grad()
            s, c = model.loss_terms(batch)
            (s / c).backward()
            opt.step()
            losses.append(float((s / c).detach()))
            if len(losses) == steps:
                break
    return model, losses


@pytest.mark.parametrize(
    "task_name, model_name, over, steps",
    [
        ("translation", "transformer_tiny", {}, 24),
        ("ner", "bert_tiny", {"max_len": 64}, 24),
        ("classification", "bert_tiny", {}, 48),
    ],
)
def test_loss_decreases_on_a_slice(task_name, model_name, over, steps, data_dir, tmp_path):
    task = build_task(*specs(task_name, model_name, over, {"dropout": 0.0}), data_dir, seed=0, cache_dir=tmp_path)
    model, losses = _train(task, list(range(64)), steps=steps)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.8 * first, (first, last)
    metrics = task.evaluate(model, max_examples=16, batch_size=8)
    assert task.metric_name in metrics and math.isfinite(metrics["loss"])


def test_evaluate_restores_training_mode_and_translates(data_dir, tmp_path):
    task = build_task(*specs("translation", "transformer_tiny"), data_dir, seed=0, cache_dir=tmp_path)
    model = task.build_model(0)
    model.blocks.train()
    greedy = task.evaluate(model, max_examples=4, batch_size=4)
    beam = task.evaluate(model, max_examples=4, batch_size=4, beam_size=2)
    assert model.blocks.training
    assert 0.0 <= greedy["bleu"] <= 100.0 and 0.0 <= beam["bleu"] <= 100.0
    assert greedy["loss"] == pytest.approx(beam["loss"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cli_prints_the_metric_last(data_dir, tmp_path, capsys, monkeypatch, precision):
    import json

    from collapipe_flwr.apps import train_central

    monkeypatch.setenv("COLLAPIPE_CACHE_DIR", str(tmp_path))
    args = [*tiny_classification_args(data_dir, 256), "--json", str(tmp_path / "m.json"), "--precision", precision]
    summary = train_central.main(args)
    assert json.loads((tmp_path / "m.json").read_text())["precision"] == precision
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("accuracy: ")
    assert float(lines[-1].split(": ")[1]) == pytest.approx(summary["val"]["accuracy"], abs=1e-4)
    assert summary["steps"] == 3 and (tmp_path / "m.json").is_file()


def test_evaluations_during_training_are_kept_and_the_last_is_the_final_model(data_dir, tmp_path, monkeypatch):
    """--eval-every-s: an evaluation after each of the 3 steps (a period shorter than any step), each on the final
    evaluation's slice; the one after step 3 judged the same model as the final evaluation, so it reads the same, and
    its training seconds leave the evaluations before it out (below train_seconds, which counts training alone)."""
    from collapipe_flwr.apps import train_central

    monkeypatch.setenv("COLLAPIPE_CACHE_DIR", str(tmp_path))
    summary = train_central.main([*tiny_classification_args(data_dir, 256), "--eval-every-s", "1e-9"])
    history = summary["val_history"]
    assert [h["step"] for h in history] == [1, 2, 3]
    assert all(h["examples"] == 32 for h in history)
    assert history[-1]["accuracy"] == pytest.approx(summary["val"]["accuracy"])
    assert history[-1]["loss"] == pytest.approx(summary["val"]["loss"], rel=1e-5)
    seconds = [h["seconds"] for h in history]
    assert seconds == sorted(seconds) and seconds[-1] <= summary["train_seconds"] + 0.05  # kept to 0.1 s
    assert summary["total_seconds"] >= summary["train_seconds"] + summary["eval_seconds"] - 1e-6


def test_cli_picks_the_task_default_model(data_dir):
    from collapipe_flwr.config import compose

    assert compose(["task=ner"])["model"]["family"] == "bert"
    assert compose(["task=ner", "model=bert_tiny"])["model"]["hidden"] == 64
    assert compose(["task=translation"])["model"]["family"] == "transformer"


def test_cli_user_error_is_one_line(capsys):
    from collapipe_flwr.apps import train_central

    with pytest.raises(SystemExit) as exit_info:
        train_central.main(["task=classification", "model=transformer_tiny", "--max-steps", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: model.family='transformer' cannot run task 'classification'")


def test_lr_schedule_shapes():
    assert [lr_factor(s, warmup_steps=4) for s in range(3)] == [0.25, 0.5, 0.75]
    assert lr_factor(3, warmup_steps=4, decay="inverse_sqrt") == pytest.approx(1.0)
    assert lr_factor(15, warmup_steps=4, decay="inverse_sqrt") == pytest.approx(math.sqrt(4 / 16))
    assert lr_factor(9, warmup_steps=0, decay="linear", total_steps=20) == pytest.approx(1 - 10 / 20)
    assert lr_factor(19, warmup_steps=0, decay="linear", total_steps=20, min_factor=0.1) == pytest.approx(0.1)
    assert lr_factor(9, decay="cosine", total_steps=20) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
