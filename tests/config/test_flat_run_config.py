"""Flat run-config keys (``flwr run . --run-config "num-server-rounds=3 task='ner'"``) set the same config as
the Hydra overrides they stand for, and every flat key is declared in pyproject.toml (Flower refuses keys
that are not)."""

from __future__ import annotations

import tomllib

import pytest

from collapipe_flwr.config import load_run_config
from collapipe_flwr.config.flower_keys import FLAT_KEYS, OTHER_KEYS, hydra_overrides
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.server_main import config_from_flower
from tests.paths import ROOT

PYPROJECT = ROOT / "pyproject.toml"


def _declared() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def test_every_flat_key_is_declared_with_a_neutral_default():
    declared = _declared()
    assert set(declared) == set(FLAT_KEYS) | set(OTHER_KEYS)
    assert hydra_overrides({k: declared[k] for k in FLAT_KEYS}) == []  # the defaults change nothing


def test_flat_keys_equal_the_overrides_they_stand_for():
    flat = {
        **_declared(),
        "num-server-rounds": 3,
        "num-clusters": 3,
        "local-steps": 7,
        "task": "ner",
        "method": "titanic",
        "scheduler": "random",
        "precision": "fp32",
        "run-name": "flat",
    }
    by_flat = config_from_flower(flat)
    by_hydra = load_run_config(
        [
            "federation.num_rounds=3",
            "federation.num_clusters=3",
            "federation.local_steps=7",
            "task=ner",
            "method=titanic",
            "scheduler=random",
            "runtime.precision=fp32",
            "run_name=flat",
        ],
        output_dir="runs",
    )
    assert by_flat == by_hydra
    assert by_flat.model.name == "bert_small"  # the task's default model, as with task=ner in overrides
    assert by_flat.federation.num_rounds == 3 and by_flat.scheduler.name == "random"


def test_flat_keys_and_overrides_combine():
    cfg = config_from_flower({"num-server-rounds": 2, "overrides": "scheduler.V=10 federation.local_steps=4"})
    assert (cfg.federation.num_rounds, cfg.federation.local_steps, cfg.scheduler.V) == (2, 4, 10.0)
    assert hydra_overrides({"resume": True, "run-name": "r1"}) == ["run_name=r1", "resume=true"]


@pytest.mark.parametrize(
    "run_config,match",
    [
        ({"num-server-rounds": 3, "overrides": "federation.num_rounds=5"}, r"federation.num_rounds is set twice"),
        ({"task": "ner", "overrides": "task=translation"}, r"^task is set twice"),
        ({"num-server-rounds": -1}, r"num-server-rounds=-1 must be >= 0"),
        ({"local-steps": 2.5}, r"local-steps=2.5 must be a whole number"),
        ({"task": "ner model=x"}, r"must be a plain name"),
        ({"resume": "maybe"}, r"resume='maybe' must be true or false"),
        ({"task": "nope"}, r"task"),
    ],
)
def test_bad_flat_keys_are_one_line_errors(run_config, match):
    with pytest.raises(ConfigError, match=match) as info:
        config_from_flower(run_config)
    assert "\n" not in str(info.value)
