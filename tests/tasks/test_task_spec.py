"""The task and model sections as typed specs: every shipped config parses, to_raw round-trips, each bad
key is a one-line ConfigError naming it, and the old ``model.schedule`` key says it was renamed."""

from __future__ import annotations

import dataclasses

import pytest

from collapipe_flwr.config import compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.tasks.lr_schedule import LrScheduleSpec, lr_factor, parse_lr_schedule
from collapipe_flwr.tasks.spec import COMMON_TASK_KEYS, ModelSpec, TaskSpec, parse_model, parse_task
from tests.conf_files import CONF, conf_group

PAIRS = [
    (task, model)
    for task, family in (("translation", "transformer"), ("ner", "bert"), ("classification", "bert"))
    for model in (p.stem for p in sorted((CONF / "model").glob("*.yaml")))
    if model.startswith(family)
]


@pytest.mark.parametrize("task_name, model_name", PAIRS)
def test_every_shipped_config_round_trips(task_name, model_name):
    raw_task, raw_model = conf_group("task", task_name), conf_group("model", model_name)
    task = parse_task(raw_task)
    model = parse_model(raw_model, task)
    assert parse_task(task.to_raw()) == task and parse_model(model.to_raw(), task) == model
    # the YAML keys come back with their values (to_raw adds the defaults of absent keys only)
    assert {k: v for k, v in task.to_raw().items() if k in raw_task} == raw_task
    back = model.to_raw()
    assert all(back[k] == v for k, v in raw_model.items() if k != "optimizer")
    assert OptimizerSpec.from_dict(raw_model["optimizer"]) == model.optimizer
    assert model.family == raw_model["family"] and model.max_len == raw_model["max_len"]


def test_task_split_typed_fields_and_options():
    task = parse_task(conf_group("task", "translation"))
    assert (task.name, task.batch_size, task.max_len, task.bucket, task.partition, task.alpha) == (
        "translation",
        64,
        64,
        50,
        "iid",
        0.5,
    )
    assert task.default_model == "transformer_small" and not task.hf_enabled
    assert task.hf_dataset["id"] == "bentrevett/multi30k"
    assert not set(task.options) & set(COMMON_TASK_KEYS)
    assert task.options["tokenizer"]["src_vocab_size"] == 5000 and task.options["label_smoothing"] == 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.batch_size = 3  # type: ignore[misc]


def test_model_split_typed_fields():
    task = parse_task(conf_group("task", "translation"))
    model = parse_model(conf_group("model", "transformer_small"), task)
    assert model.sizes == {"d_model": 256, "n_heads": 4, "d_ff": 512, "enc_layers": 3, "dec_layers": 2}
    assert model.width == 256 and model.tie_embeddings and model.dropout == 0.1
    assert model.encoder_blocks == 3  # L: the encoder's blocks, not the decoder's 2
    bert = parse_model(conf_group("model", "bert_small", layers=6), parse_task(conf_group("task", "classification")))
    assert bert.encoder_blocks == 6
    assert model.optimizer == OptimizerSpec(name="adam", lr=0.002, weight_decay=0.0, betas=(0.9, 0.98))
    assert model.lr_schedule == LrScheduleSpec(warmup_steps=150, decay="linear", total_steps=0, min_factor=0.05)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"batch_size": 0}, r"task.batch_size=0 must be an integer >= 1"),
        ({"batch_size": True}, r"task.batch_size=True"),
        ({"max_len": 3}, r"task.max_len=3 must be an integer >= 4"),
        ({"partition": "shards"}, r"task.partition='shards' must be one of"),
        ({"alpha": 0}, r"task.alpha=0 must be a number > 0"),
        ({"bucket": -1}, r"task.bucket=-1 must be an integer >= 0"),
        ({"hf_dataset": "yes"}, r"task.hf_dataset must be a mapping"),
        ({"bogus": 1}, r"unknown config key task.bogus; valid keys of task translation are .*train_src"),
        ({"vocab_file": "x"}, r"unknown config key task.vocab_file"),  # a key of another task
        ({"train_src": ""}, r"task.train_src is empty"),
        ({"label_smoothing": 1.0}, r"task.label_smoothing=1.0 must be a number in \[0, 1\)"),
        ({"tokenizer": {"kind": "bpe", "vocab": 3}}, r"unknown config key task.tokenizer.vocab"),
    ],
)
def test_bad_task_keys_are_one_line_errors(over, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_task(conf_group("task", "translation", **over))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "task_name, over, match",
    [
        ("ner", {"crf": "yes"}, r"task.crf='yes' must be true"),
        ("ner", {"extra_train_files": "a.txt"}, r"task.extra_train_files must be a list"),
        ("classification", {"num_labels": 1}, r"task.num_labels=1 must be an integer >= 2"),
        ("classification", {"vocab_file": ""}, r"task.vocab_file is empty"),
    ],
)
def test_each_task_checks_its_options(task_name, over, match):
    with pytest.raises(ConfigError, match=match):
        parse_task(conf_group("task", task_name, **over))


def test_missing_or_unknown_task():
    with pytest.raises(ConfigError, match="config group task is missing"):
        parse_task(None)
    with pytest.raises(ConfigError, match="task.name is missing"):
        parse_task({"batch_size": 4})
    with pytest.raises(
        ConfigError, match="task.name='poetry' is not a known task; pick one of causal_lm, classification, ner, transl"
    ):
        parse_task({"name": "poetry"})


@pytest.mark.parametrize(
    "over, match",
    [
        (
            {"family": "bert"},
            (
                r"model.family='bert' cannot run task 'translation', which needs a transformer model; "
                r"pick model=transformer_small"
            ),
        ),
        ({"d_model": 0}, r"model.d_model=0 must be an integer >= 1"),
        ({"n_heads": 3}, r"model.n_heads=3 must divide the hidden size 64"),
        ({"max_len": 64}, r"model.max_len=64 is shorter than task.max_len=64 \+ 1; raise model.max_len"),
        ({"dropout": 1.0}, r"model.dropout=1.0 must be a number in \[0, 1\)"),
        ({"tie_embeddings": "no"}, r"model.tie_embeddings='no' must be true or false"),
        ({"hidden": 64}, r"unknown config key model.hidden; a transformer model has d_model"),
        ({"optimizer": {"name": "lamb", "lr": 1.0}}, r"optimizer name 'lamb' is not one of"),
        ({"optimizer": {"name": "adam", "learning_rate": 1.0}}, r"bad model.optimizer .* valid keys are name, lr"),
        ({"optimizer": 3}, r"config section model.optimizer must be a mapping"),
        ({"pretrained_dir": "/nowhere/bert"}, r"model.pretrained_dir='/nowhere/bert' is not a folder"),
        ({"lr_schedule": {"decay": "step"}}, r"model.lr_schedule.decay='step' must be one of none, inverse_sqrt"),
        ({"lr_schedule": {"warmup_steps": -1}}, r"model.lr_schedule.warmup_steps=-1 must be an integer >= 0"),
        ({"lr_schedule": {"min_factor": 2}}, r"model.lr_schedule.min_factor=2.0 must be in \[0, 1\]"),
        ({"lr_schedule": {"warmup": 5}}, r"unknown config key model.lr_schedule.warmup"),
        ({"schedule": {"warmup_steps": 5}}, r"^model.schedule was renamed to model.lr_schedule"),
    ],
)
def test_bad_model_keys_are_one_line_errors(over, match):
    task = parse_task(conf_group("task", "translation"))
    with pytest.raises(ConfigError, match=match) as err:
        parse_model(conf_group("model", "transformer_tiny", **over), task)
    assert "\n" not in str(err.value)


def test_specs_check_themselves_when_built_directly():
    with pytest.raises(ConfigError, match="task.max_len=2"):
        TaskSpec(name="ner", batch_size=4, max_len=2)
    with pytest.raises(ConfigError, match="model.family='gpt'"):
        ModelSpec(family="gpt", sizes={}, max_len=8)
    with pytest.raises(ConfigError, match="a bert model has the sizes hidden, n_heads, d_ff, layers"):
        ModelSpec(family="bert", sizes={"hidden": 8}, max_len=8)
    assert TaskSpec(name="ner", batch_size=4, max_len=8).to_raw()["alpha"] == 0.5


def test_lr_schedule_spec_is_lr_factor_with_the_trainers_total():
    spec = parse_lr_schedule({"warmup_steps": 3, "decay": "linear", "min_factor": 0.1})
    assert [spec.factor(s, 20) for s in range(25)] == [lr_factor(s, 3, "linear", 20, 0.1) for s in range(25)]
    fixed = dataclasses.replace(spec, total_steps=10)
    assert [fixed.factor(s, 20) for s in range(25)] == [lr_factor(s, 3, "linear", 10, 0.1) for s in range(25)]
    assert parse_lr_schedule(None) == LrScheduleSpec() and LrScheduleSpec().factor(7) == 1.0
    assert parse_lr_schedule(spec.to_raw()) == spec


def test_an_override_of_the_old_schedule_key_names_the_new_one():
    with pytest.raises(
        ConfigError,
        match=r"^model.schedule was renamed to model.lr_schedule; write "
        r"model.lr_schedule.warmup_steps=\.\.\.",
    ):
        compose(["task=translation", "model.schedule.warmup_steps=4"])
    composed = compose(["task=translation", "model.lr_schedule.warmup_steps=4"])
    assert composed["model"]["lr_schedule"]["warmup_steps"] == 4
