"""eval.every: the server evaluates after round 0, every k-th round and the last round, and still logs
every round."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from collapipe_flwr.config import EvalSpec
from collapipe_flwr.config.privacy import PrivacySpec
from collapipe_flwr.config.round_adapters import RoundAdaptersSpec
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.records.run_log import RunLog
from collapipe_flwr.fl.server.strategy import CollaPipeStrategy


class _CountingServer:
    planner = SimpleNamespace(policy_name="dssra")

    def __init__(self, every: int, rounds: int) -> None:
        self.cfg = SimpleNamespace(
            eval=EvalSpec(every=every),
            federation=SimpleNamespace(num_rounds=rounds, max_failed_rounds=3),
            method=SimpleNamespace(name="collapipe"),
            privacy=PrivacySpec(),  # off: nothing to account
            checkpoint=False,
            round_adapters=RoundAdaptersSpec(every=0),  # no adapters to write
        )
        self.calls = 0

    def evaluate(self) -> dict:
        self.calls += 1
        return {"accuracy": 0.5, "loss": 1.0}


@pytest.mark.parametrize("every,rounds,evaluated", [(1, 4, [0, 1, 2, 3, 4]), (3, 7, [0, 3, 6, 7]), (5, 2, [0, 2])])
def test_rounds_evaluated(tmp_path, every, rounds, evaluated):
    server = _CountingServer(every, rounds)
    strategy = CollaPipeStrategy(server, RunLog(tmp_path))
    answers = {t: strategy.evaluate(t, None) for t in range(rounds + 1)}
    assert sorted(t for t, a in answers.items() if a is not None) == evaluated
    assert server.calls == len(evaluated)
    records = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(rounds + 1))
    assert [r["round"] for r in records if "val_accuracy" in r] == evaluated


def test_bad_every_is_one_line():
    with pytest.raises(ConfigError, match="eval.every"):
        EvalSpec(every=0)


def test_eval_precision_follows_the_runtime_unless_set():
    from collapipe_flwr.config import load_run_config

    assert EvalSpec().resolved_precision("bf16") == "bf16"  # runtime (default): runtime.precision's
    assert EvalSpec(precision="fp32").resolved_precision("bf16") == "fp32"
    assert "precision" not in EvalSpec().to_raw()  # earlier runs' config.json stays the same (resume compares)
    cfg = load_run_config(["eval.precision=fp32"])
    assert cfg.to_dict()["eval"]["precision"] == "fp32"
    assert type(cfg).from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="eval.precision='fp16' must be one of runtime, auto, fp32, bf16"):
        load_run_config(["eval.precision=fp16"])
