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
from collapipe_flwr.fl.server.training_watch import NothingTrained
from tests.inprocess_grid import InProcessGrid

pytestmark = pytest.mark.e2e

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


@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
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


@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_a_round_no_cu_can_upload_in_is_sat_out_and_a_run_of_only_such_rounds_fails_with_the_reason(data_dir, tmp_path):
    """E_n^max = 1e-9 J: C8 fails for every CU on every channel in every round. The old server raised
    InfeasiblePlanError in round 1 and saved nothing (issue 31); then it sat every round out and printed "done"
    with the untrained model (issue 45). Now each round is sat out and recorded, and the run fails at its end
    with C8's reason: nothing trained."""
    with pytest.raises(NothingTrained, match=r"any of rounds 1-2; last: no CU was selected \(CU 0: .*E_n\^max"):
        _run(data_dir, tmp_path, "no_uplink", InProcessGrid(2, str(data_dir)), "network.uplink.energy_max_j=1e-9")
    folder = tmp_path / "no_uplink"
    rounds = [r for r in _rounds(folder) if r["round"] > 0]
    assert [r["round"] for r in rounds] == [1, 2]  # every round's record kept
    start = _rounds(folder)[0]
    for r in rounds:
        assert not r.get("clients") and r.get("train_loss") is None and r["failures"] == []
        assert not any(c["selected"] for c in r["plan"]["clusters"])
        reasons = r["modelled"]["left_out"]
        assert sorted(reasons) == ["0", "1"] and all("E_n^max" in why and "C8" in why for why in reasons.values())
        assert r["val_loss"] == pytest.approx(start["val_loss"])  # the global model was kept as it was
    assert not (folder / "summary.json").exists() and not (folder / "model").exists()


class _EveryReplyBroken(InProcessGrid):
    """Every CU's train reply loses its train-loss, so the server refuses every CU in every round."""

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for reply in replies:
            if reply.metadata.message_type == msg.TRAIN and reply.has_content():
                metrics = dict(reply.content.metric_records[msg.METRICS])
                metrics.pop("train-loss")
                reply.content.metric_records[msg.METRICS] = MetricRecord(metrics)
        return replies


def test_k_rounds_in_a_row_whose_cus_all_fail_stop_the_run_with_the_last_reason(
    data_dir, tmp_path, capsys, monkeypatch
):
    """federation.max_failed_rounds=2 of 4 rounds: the run stops after round 2, both rounds recorded, no
    summary.json, no model, and the one-line error names the CU and why its reply was refused. The failed run
    still releases its CUs: the CU-state files they wrote after each round are gone."""
    state_dir = tmp_path / "cu-state"
    monkeypatch.setenv("COLLAPIPE_CU_STATE_DIR", str(state_dir))
    grid = _EveryReplyBroken(2, str(data_dir))
    with pytest.raises(NothingTrained, match=r"rounds 1-2 \(2 in a row.*last failure: cluster 1: .*train-loss"):
        _run(data_dir, tmp_path, "all_fail", grid, "federation.num_rounds=4 federation.max_failed_rounds=2")
    folder = tmp_path / "all_fail"
    assert [r["round"] for r in _rounds(folder)] == [0, 1, 2]
    assert all(sorted(f["cluster"] for f in r["failures"]) == [0, 1] for r in _rounds(folder)[1:])
    assert not (folder / "summary.json").exists() and not (folder / "model").exists()
    err = capsys.readouterr().err
    assert "error: no CU completed a round" in err and "done:" not in err
    assert state_dir.is_dir() and list(state_dir.rglob("*.pt")) == []  # written each round, removed on failure


def test_a_run_whose_cus_all_fail_in_every_round_fails_at_its_end_when_k_is_off(data_dir, tmp_path):
    with pytest.raises(NothingTrained, match="any of rounds 1-2"):
        _run(data_dir, tmp_path, "all_fail", _EveryReplyBroken(2, str(data_dir)), "federation.max_failed_rounds=0")
    assert not (tmp_path / "all_fail" / "summary.json").exists()


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
