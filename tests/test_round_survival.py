"""One CU reply or one infeasible round must not end a run (issue 31).

The whole server and the real CU handlers run in this process (``tests/inprocess_grid.py``). The references
are independent of the server's code paths under test: a CU reply tampered after the real CU made it (the
other CU's reply untouched), and a network whose upload energy limit E_n^max no CU can meet on any channel.
"""

from __future__ import annotations

import json
import math

import pytest
from flwr.app import MetricRecord

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl import messages as msg
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.model_store import read_meta
from tests.inprocess_grid import InProcessGrid

BASE = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
    "federation.local_steps=1 runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=16 "
    "eval.every=1 eval.at_start=true"
)


class _TamperingGrid(InProcessGrid):
    """Replaces one metric of node ``node``'s train replies with ``value`` (``...`` removes it)."""

    def __init__(self, *args, node: int, key: str, value, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.node, self.key, self.value = node, key, value

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if reply.metadata.message_type != msg.TRAIN or reply.metadata.src_node_id != self.node:
                continue
            metrics = dict(reply.content.metric_records[msg.METRICS])
            if self.value is ...:
                metrics.pop(self.key)
            else:
                metrics[self.key] = self.value
            reply.content.metric_records[msg.METRICS] = MetricRecord(metrics)
        return replies


def _rounds(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


def _run(data_dir, out, name: str, grid, extra: str = ""):
    overrides = f"{BASE} run_name={name} {extra}".strip()
    return run_server(grid, {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(out)})


@pytest.mark.parametrize(
    "value,match",
    [(..., "lacks the metric train-loss"), ([1.0, 2.0], "train-loss"), (math.nan, "train-loss=nan"), (1e308, "1e+308")],
)
def test_a_bad_train_loss_is_one_refused_reply_and_the_run_goes_on(data_dir, tmp_path, value, match):
    grid = _TamperingGrid(2, str(data_dir), node=102, key="train-loss", value=value)
    folder = _run(data_dir, tmp_path, "tampered", grid)
    rounds = [r for r in _rounds(folder) if r["round"] > 0]
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert [f["cluster"] for f in r["failures"]] == [1] and match in r["failures"][0]["error"]
        assert "\n" not in r["failures"][0]["error"]
        assert r["train_loss"] == pytest.approx(r["clients"]["0"]["train-loss"])  # CU 0 alone, a finite loss
    assert (folder / "summary.json").is_file() and (folder / "checkpoint.pt").is_file()


def test_a_round_no_cu_can_upload_in_is_sat_out_and_the_run_finishes_with_its_model(data_dir, tmp_path):
    """E_n^max = 1e-9 J: C8 fails for every CU on every channel in every round (the old server raised
    InfeasiblePlanError in round 1 and saved nothing)."""
    folder = _run(data_dir, tmp_path, "no_uplink", InProcessGrid(2, str(data_dir)), "network.uplink.energy_max_j=1e-9")
    rounds = [r for r in _rounds(folder) if r["round"] > 0]
    assert [r["round"] for r in rounds] == [1, 2]
    start = _rounds(folder)[0]
    for r in rounds:
        assert not r.get("clients") and r.get("train_loss") is None and r["failures"] == []
        assert not any(c["selected"] for c in r["plan"]["clusters"])
        reasons = r["modelled"]["left_out"]
        assert sorted(reasons) == ["0", "1"] and all("E_n^max" in why and "C8" in why for why in reasons.values())
        assert r["val_loss"] == pytest.approx(start["val_loss"])  # the global model was kept as it was
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["num_rounds"] == 2
    assert read_meta(folder / "model")["format"] and list((folder / "model").glob("*.safetensors"))


def test_a_run_that_fails_to_start_does_not_block_its_name(data_dir, tmp_path, monkeypatch, capsys):
    """runtime.server_device=cuda without a GPU fails in the server's start-up; it used to leave a config.json that
    made every rerun of the name 'already holds a run'."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="server_device=cuda"):  # raised on to Flower, which records it
        _run(data_dir, tmp_path, "named", InProcessGrid(2, str(data_dir)), "runtime.server_device=cuda")
    assert "error: runtime.server_device=cuda" in capsys.readouterr().err
    assert not (tmp_path / "named" / "config.json").exists()
    folder = _run(data_dir, tmp_path, "named", InProcessGrid(2, str(data_dir), run_id=8), "federation.num_rounds=1")
    assert (folder / "summary.json").is_file()
