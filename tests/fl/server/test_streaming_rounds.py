"""Whole runs over a grid with Flower's push/pull API, where the server pulls and folds each reply as it arrives.

The same run over the tests' list grid (``send_and_receive`` only, every reply at once) is the reference: the
streamed rounds must give the same losses and the same model, and a CU that never answers must be the round's
failure after ``federation.round_timeout_s`` with the other CU aggregated, as before.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from collapipe_flwr.fl import messages as msg
from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid

pytestmark = pytest.mark.e2e

BASE = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
    "federation.local_steps=1 runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=16 "
    "eval.every=1 model.dropout=0.0 checkpoint=false"
)


class _PushPullGrid(InProcessGrid):
    """The CUs answer at push time; ``pull_messages`` hands out the replies asked for. Node ``silent`` never
    answers a train message. Records the ids of every pull (the hello and the train messages are pulled; the
    release after the last round goes through ``send_and_receive``)."""

    pull_interval = 0.01

    def __init__(self, *args, silent: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.silent, self.replies, self.pulls = silent, {}, []

    def push_messages(self, messages):
        messages = list(messages)
        answering = [
            m for m in messages if not (m.metadata.dst_node_id == self.silent and m.metadata.message_type == msg.TRAIN)
        ]
        ids = {id(m): None for m in messages}
        for reply in InProcessGrid.send_and_receive(self, answering):
            self.replies[reply.metadata.reply_to_message_id] = reply
        for m in messages:
            if m.metadata.message_id == "":  # the silent CU's message: an id, never a reply
                m.metadata.__dict__["_message_id"] = f"silent{len(self.pulls)}-{m.metadata.dst_node_id}"
            ids[id(m)] = m.metadata.message_id
        return list(ids.values())

    def pull_messages(self, message_ids):
        message_ids = list(message_ids)
        self.pulls.append(message_ids)
        return [self.replies.pop(i) for i in message_ids if i in self.replies]


def _run(data_dir, out, name: str, grid, extra: str = ""):
    overrides = f"{BASE} run_name={name} {extra}".strip()
    return run_server(grid, {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(out)})


def _trained(folder) -> list[dict]:
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    return [r for r in rounds if r["round"] > 0]


def test_streamed_rounds_match_the_all_at_once_rounds(data_dir, tmp_path):
    streamed_grid = _PushPullGrid(2, str(data_dir), run_id=31)
    streamed = _run(data_dir, tmp_path, "streamed", streamed_grid, "save_client_weights=true")
    reference = _run(data_dir, tmp_path, "listed", InProcessGrid(2, str(data_dir), run_id=32))
    assert streamed_grid.pulls and all(len(ids) == 1 for ids in streamed_grid.pulls)  # one reply per pull
    for got, want in zip(_trained(streamed), _trained(reference), strict=True):
        assert got["failures"] == [] and sorted(got["clients"]) == ["0", "1"]
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6)
    saved = sorted(p.name for p in (streamed / "weights").iterdir())  # each CU's as it was folded in, then the global
    assert saved == [f"round{t}_{who}.pt" for t in (1, 2) for who in ("cluster0", "cluster1", "global")]
    for part in ("embedding", "encoder"):
        a, b = (
            load_file(streamed / "model" / f"{part}.safetensors"),
            load_file(reference / "model" / f"{part}.safetensors"),
        )
        assert all((a[k] - b[k]).abs().max() <= 1e-6 for k in b)


def test_a_cu_that_never_answers_is_the_rounds_failure_after_the_timeout(data_dir, tmp_path):
    grid = _PushPullGrid(2, str(data_dir), run_id=33, silent=102)
    folder = _run(data_dir, tmp_path, "silent", grid, "federation.round_timeout_s=0.5")
    rounds = _trained(folder)
    assert [r["round"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["failures"] == [{"cluster": 1, "error": "no reply within federation.round_timeout_s"}]
        assert sorted(r["clients"]) == ["0"]
        assert r["train_loss"] == pytest.approx(r["clients"]["0"]["train-loss"])
        assert r["measured_s"]["wait_clients_s"] >= 0.5
