"""RoundLedger (fl/records/round_ledger.py): a round's record from open to close, and the order of what closing does."""

from __future__ import annotations

import json

import pytest

from collapipe_flwr.fl.records.round_ledger import RoundLedger
from collapipe_flwr.fl.records.run_log import RunLog
from collapipe_flwr.fl.round_report import RoundReport
from tests.fl.server.aggregation.test_reply_checks import GOOD


class _Progress:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def round_finished(self, t: int, line: dict) -> None:
        self.calls.append(("progress", t, line["round"]))


class _RunLog(RunLog):
    def __init__(self, folder, calls: list) -> None:
        super().__init__(folder)
        self.calls = calls

    def append_round(self, record: dict) -> None:
        self.calls.append(("line", record["round"]))
        super().append_round(record)


def _ledger(tmp_path, calls: list, checkpoint: bool = True) -> RoundLedger:
    return RoundLedger(
        _RunLog(tmp_path, calls),
        _Progress(calls),  # type: ignore[arg-type]
        [lambda line: calls.append(("listener", line["round"]))],
        (lambda t: calls.append(("checkpoint", t))) if checkpoint else None,
        lambda: calls.append(("check",)),
    )


def _lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]


def test_close_writes_the_line_then_checkpoint_progress_listeners_and_the_check(tmp_path):
    calls: list = []
    ledger = _ledger(tmp_path, calls)
    ledger.initial({"accuracy": 0.25})
    ledger.open(1, "collapipe", "dssra")
    ledger.fail(3, "refused")
    assert ledger.failures == [{"cluster": 3, "error": "refused"}] and ledger.plan is None
    ledger.note_seconds("aggregate_s", 0.5)
    ledger.note_training(1.5, {0: RoundReport.from_record(GOOD)})
    line = ledger.close(1, {"accuracy": 0.5}, evaluated_since=0.0)
    assert calls == [("line", 0), ("line", 1), ("checkpoint", 1), ("progress", 1, 1), ("listener", 1), ("check",)]
    assert not ledger.is_open(1)  # closed: the next round opens its own
    first, second = _lines(tmp_path)
    assert {k: v for k, v in first.items() if k != "elapsed_s"} == {"round": 0, "val_accuracy": 0.25}
    assert (
        second["train_loss"] == 1.5
        and second["val_accuracy"] == 0.5
        and second["clients"] == {"0": GOOD}  # the CU's report, flat as it travelled
    )
    assert list(line["measured_s"]) == ["aggregate_s", "evaluate_s", "round_s"]


def test_a_round_opened_at_its_evaluation_and_no_checkpoint(tmp_path):
    calls: list = []
    ledger = _ledger(tmp_path, calls, checkpoint=False)
    assert not ledger.is_open(2)
    ledger.open(2, "collapipe", "dssra", started_at=0.0)
    ledger.close(2, {}, evaluated_since=0.0)
    assert calls == [("line", 2), ("progress", 2, 2), ("listener", 2), ("check",)]
    (record,) = _lines(tmp_path)
    assert record["failures"] == [] and record["plan"] is None and "train_loss" not in record


def test_nothing_is_noted_or_closed_without_an_open_round(tmp_path):
    ledger = _ledger(tmp_path, [])
    with pytest.raises(RuntimeError, match="no round is open"):
        ledger.fail(0, "x")
    ledger.open(1, "collapipe", "dssra")
    with pytest.raises(RuntimeError, match="round 2 is not open"):
        ledger.close(2, {}, evaluated_since=0.0)
