"""A killed run resumes from its last complete round and continues as if it had never stopped; a run folder
that exists is refused unless ``resume=true``; run files are written atomically.

The whole server and the real CU handlers run in this process (``tests/inprocess_grid.py``). The reference is
an uninterrupted run of the same seed; the killed run stops when round 3's train messages are sent (as if
the server process died), and a new server process (a new Flower run) resumes it from ``checkpoint.pt``.
"""

from __future__ import annotations

import json

import pytest

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.messages import TRAIN
from collapipe_flwr.fl.server.checkpoint import CHECKPOINT_FILE
from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid

# optimizer_state=reset: every CU round starts from the server's weights alone, so the server's checkpoint is
# everything the next round depends on; dropout 0: no CU-side random state either (see fl/server/checkpoint.py)
BASE = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=4 "
    "federation.local_steps=2 federation.optimizer_state=reset federation.server_optimizer=fedadam "
    "runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=16 eval.every=1 "
    "model.dropout=0.0"
)


class _ServerKilled(Exception):
    pass


class _DyingGrid(InProcessGrid):
    """Delivers messages until round ``die_at``'s train messages, then dies like a killed server."""

    def __init__(self, *args, die_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.die_at, self.trains, self.dead = die_at, 0, False

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if self.dead:  # a killed server sends nothing more (not even the release a failed run sends)
            raise _ServerKilled
        if messages and messages[0].metadata.message_type == TRAIN:
            self.trains += 1
            if self.trains == self.die_at:
                self.dead = True
                raise _ServerKilled
        return super().send_and_receive(messages, timeout)


def _rounds(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


def _run(data_dir, out, name: str, grid, extra: str = ""):
    overrides = f"{BASE} run_name={name} {extra}".strip()
    return run_server(grid, {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(out)})


@pytest.mark.e2e
def test_resumed_run_continues_exactly_like_an_uninterrupted_one(data_dir, tmp_path):
    reference = _rounds(_run(data_dir, tmp_path, "whole", InProcessGrid(2, str(data_dir), run_id=11)))

    with pytest.raises(_ServerKilled):
        _run(data_dir, tmp_path, "killed", _DyingGrid(2, str(data_dir), run_id=12, die_at=3))
    folder = tmp_path / "killed"
    assert [r["round"] for r in _rounds(folder)] == [0, 1, 2]  # rounds 1 and 2 complete, round 3 never was
    assert (folder / CHECKPOINT_FILE).is_file() and not (folder / "summary.json").exists()

    resumed_folder = _run(data_dir, tmp_path, "killed", InProcessGrid(2, str(data_dir), run_id=13), "resume=true")
    resumed = _rounds(resumed_folder)
    assert [r["round"] for r in resumed] == [0, 1, 2, 3, 4]
    for got, want in zip(resumed[3:], reference[3:], strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6, abs=1e-9)
        for cluster in want["clients"]:
            assert got["clients"][cluster]["train-losses"] == pytest.approx(
                want["clients"][cluster]["train-losses"], rel=1e-6, abs=1e-9
            )
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6, abs=1e-9)
        assert got["plan"] == want["plan"]  # the policy's queues and generator were restored too
    summary = json.loads((resumed_folder / "summary.json").read_text())
    assert summary["final_val"]["loss"] == pytest.approx(reference[-1]["val_loss"], rel=1e-6)


@pytest.mark.e2e
def test_existing_run_folder_is_refused_unless_resumed(data_dir, tmp_path, capsys):
    _run(data_dir, tmp_path, "once", InProcessGrid(2, str(data_dir), run_id=21), "federation.num_rounds=1")
    before = (tmp_path / "once" / "rounds.jsonl").read_text()
    with pytest.raises(CollaPipeError):  # raised on to Flower, which records the run as failed with it
        _run(data_dir, tmp_path, "once", InProcessGrid(2, str(data_dir), run_id=22), "federation.num_rounds=1")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: run folder") and "resume=true" in err
    assert (tmp_path / "once" / "rounds.jsonl").read_text() == before  # nothing appended, nothing lost


@pytest.mark.e2e
def test_resume_with_a_different_config_is_refused(data_dir, tmp_path, capsys):
    with pytest.raises(_ServerKilled):
        _run(data_dir, tmp_path, "r", _DyingGrid(2, str(data_dir), run_id=31, die_at=2))
    with pytest.raises(CollaPipeError):
        _run(
            data_dir, tmp_path, "r", InProcessGrid(2, str(data_dir), run_id=32), "resume=true federation.local_steps=3"
        )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "federation.local_steps" in err and "resume" in err


def test_torn_last_record_does_not_merge_with_the_next(tmp_path):
    from collapipe_flwr.fl.records.run_log import RunLog, read_rounds

    log = RunLog(tmp_path / "run")
    log.append_round({"round": 1})
    with (tmp_path / "run" / "rounds.jsonl").open("a") as fh:
        fh.write('{"round": 2, "train_lo')  # the writer died mid-line
    log.append_round({"round": 3})
    assert [r["round"] for r in read_rounds(tmp_path / "run")] == [1, 3]


def test_a_full_disk_is_a_one_line_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    import errno
    import tempfile

    from collapipe_flwr.errors import CollaPipeError
    from collapipe_flwr.fl.records.run_log import RunLog

    log = RunLog(tmp_path / "run")
    log.write_summary({"final_val": {"bleu": 1.0}})

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_space)
    with pytest.raises(CollaPipeError) as info:
        log.write_summary({"final_val": {"bleu": 2.0}})
    message = str(info.value)
    assert "summary.json" in message and "No space left on device" in message and "\n" not in message
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == {"final_val": {"bleu": 1.0}}


@pytest.mark.e2e
@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_a_resumed_run_with_kept_moments_equals_the_uninterrupted_one(data_dir, tmp_path, monkeypatch):
    """federation.optimizer_state=keep (the default): the CUs' Adam moments live on the CUs, not in the server's
    checkpoint; each CU checkpoints them on its own disk (fl/cu/cu_checkpoint.py) and the resumed run's new CU
    processes load them, so the rounds after the resume equal the uninterrupted run's to 1e-6."""
    monkeypatch.setenv("COLLAPIPE_CU_STATE_DIR", str(tmp_path / "cu-state"))
    keep = "federation.optimizer_state=keep"
    reference = _rounds(_run(data_dir, tmp_path, "whole", InProcessGrid(2, str(data_dir), run_id=41), keep))
    assert not any((tmp_path / "cu-state").rglob("*.pt"))  # a finished run leaves no CU state behind

    with pytest.raises(_ServerKilled):
        _run(data_dir, tmp_path, "killed", _DyingGrid(2, str(data_dir), run_id=42, die_at=3), keep)
    saved = sorted(p.name for p in (tmp_path / "cu-state").rglob("*.pt"))
    assert saved == ["cluster0.pt", "cluster1.pt"]  # each CU's moments after round 2
    resumed = _rounds(
        _run(data_dir, tmp_path, "killed", InProcessGrid(2, str(data_dir), run_id=43), f"{keep} resume=true")
    )
    assert [r["round"] for r in resumed] == [0, 1, 2, 3, 4]
    for got, want in zip(resumed[3:], reference[3:], strict=True):
        for cluster in want["clients"]:
            assert got["clients"][cluster]["optimizer-restored"] == (1 if got["round"] == 3 else 0)
            assert got["clients"][cluster]["train-losses"] == pytest.approx(
                want["clients"][cluster]["train-losses"], rel=1e-6, abs=1e-9
            )
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6, abs=1e-9)


@pytest.mark.e2e
@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_without_the_cu_state_the_resumed_run_would_differ(data_dir, tmp_path, monkeypatch):
    """The reference for the test above: the same resume with the CU state files removed starts round 3 with
    fresh moments and trains to other losses (so equality there is the moments' doing)."""
    monkeypatch.setenv("COLLAPIPE_CU_STATE_DIR", str(tmp_path / "cu-state"))
    keep = "federation.optimizer_state=keep"
    reference = _rounds(_run(data_dir, tmp_path, "whole", InProcessGrid(2, str(data_dir), run_id=51), keep))
    with pytest.raises(_ServerKilled):
        _run(data_dir, tmp_path, "killed", _DyingGrid(2, str(data_dir), run_id=52, die_at=3), keep)
    for path in (tmp_path / "cu-state").rglob("*.pt"):
        path.unlink()
    resumed = _rounds(
        _run(data_dir, tmp_path, "killed", InProcessGrid(2, str(data_dir), run_id=53), f"{keep} resume=true")
    )
    got, want = resumed[3]["clients"]["0"]["train-losses"], reference[3]["clients"]["0"]["train-losses"]
    assert got[0] == pytest.approx(want[0], rel=1e-6)  # the first step's loss is computed before any update
    assert abs(got[-1] - want[-1]) > 1e-6


def test_the_release_message_removes_the_cu_state_even_in_a_process_without_the_session(tmp_path, monkeypatch):
    """Flower's simulation handles a CU's release on any worker of its pool: the key comes with the message (a
    finished `collapipe run` used to leave its CUs' moments in ~/.cache)."""
    import torch

    from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, release_run
    from collapipe_flwr.fl.cu.cu_checkpoint import load_cu_state, save_cu_state, state_path
    from collapipe_flwr.fl.cu.state_store import CUStateStore

    monkeypatch.setenv("COLLAPIPE_CU_STATE_DIR", str(tmp_path / "cu-state"))
    path = save_cu_state("abc123", 1, 4, {"embedding|w|exp_avg": torch.ones(3)})
    assert path == state_path("abc123", 1) and load_cu_state("abc123", 1, before=5) is not None
    assert load_cu_state("abc123", 1, before=4) is None  # only moments of an earlier round are taken
    assert release_run(CUStateStore(), ClusterIdentity(1, 2), "a-run-this-process-never-saw", 0, "abc123") == 0
    assert not path.exists() and not path.parent.exists()
