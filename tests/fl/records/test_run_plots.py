"""A run's own plots and TensorBoard scalars (collapipe_flwr/fl/records/run_plots.py).

The rounds.jsonl files are written by hand in the shape the server writes (round 0 holds only the initial
evaluation; training rounds carry ``clients`` with ``device-peak-bytes``, ``plan``, ``modelled`` with the
per-CU delay split and energy, ``measured_s``); the expected scalars are the numbers written here.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import matplotlib.image
import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.records.run_plots import (
    TensorBoardLog,
    load_rounds,
    round_scalars,
    write_run_plots,
    write_tensorboard,
)
from tests.paths import GOLDEN_DIR

GOLDEN = GOLDEN_DIR / "rounds_translation_tiny_seed0.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 1024 * 1024
ALL = ["loss.png", "metric.png", "delay.png", "memory.png"]


def _cluster(compute, d2d, uplink, device_energy, cu_energy, selected=True):
    return {
        "Y": 0.0,
        "compute_s": compute,
        "d2d_s": d2d,
        "uplink_s": uplink if selected else 0.0,
        "pipeline_s": compute + d2d,
        "delay_s": compute + d2d + uplink if selected else 0.0,
        "device_energy_j": device_energy,
        "cu_energy_j": cu_energy if selected else 0.0,
        "gamma": 0.0,
    }


def _client(loss, peaks):
    return {
        "num-examples": 16,
        "steps": 2,
        "train-loss": loss,
        "train-losses": [loss, loss],
        "seconds-train": 0.1,
        "device-peak-bytes": peaks,
        "device-compute-seconds": [0.01 if p else 0.0 for p in peaks],
    }


def _round(t, loss, cu_losses, rows, selected, peaks, bleu=None, measured=True):
    plan = [
        {"S": 1, "channel": n, "cluster": n, "delta": [2, 0, 0], "m": 1, "power_w": 0.5, "selected": chosen}
        for n, chosen in enumerate(selected)
    ]
    modelled = {
        "V": 0.01,
        "method": "collapipe",
        "policy": "dssra",
        "round_delay_s": max(r["delay_s"] for r, chosen in zip(rows, selected) if chosen),
        "clusters": rows,
    }
    record = {
        "round": t,
        "method": "collapipe",
        "scheduler": "dssra",
        "train_loss": loss,
        "clients": {str(n): _client(cu_losses[n], peaks[n]) for n, chosen in enumerate(selected) if chosen},
        "failures": [],
        "plan": {"clusters": plan, "modelled": modelled},
        "modelled": modelled,
        "elapsed_s": 3.0 * t,
    }
    if measured:
        record["measured_s"] = {"plan_s": 0.01, "wait_clients_s": 1.5 * t, "aggregate_s": 0.02, "round_s": 2.0 * t}
    if bleu is not None:
        record.update({"val_bleu": bleu, "val_loss": loss + 0.5, "val_examples": 16.0})
    return record


def hand_rounds(evaluated=True, measured=True, memory=True):
    """Round 1: CU0 2+1+4 = 7 s, CU1 3+1+5 = 9 s (bottleneck, split 3 / 1 / 5); round 2: CU1 not selected
    (its 99 s must be ignored), CU0 1+0.5+2 = 3.5 s."""

    def peaks(*per_cu):
        return [[p * MIB for p in cu] if memory else [] for cu in per_cu]

    r1 = _round(
        1,
        8.5,
        [8.6, 8.4],
        [_cluster(2.0, 1.0, 4.0, [0.25, 0.0, 0.0], 3.0), _cluster(3.0, 1.0, 5.0, [0.0, 0.5, 0.0], 4.0)],
        [True, True],
        peaks([100, 0, 0], [0, 50, 25]),
        bleu=0.25 if evaluated else None,
        measured=measured,
    )
    r2 = _round(
        2,
        8.0,
        [8.0, 7.0],
        [_cluster(1.0, 0.5, 2.0, [0.125, 0.0, 0.0], 1.0), _cluster(90.0, 4.0, 5.0, [9.0], 9.0, selected=False)],
        [True, False],
        peaks([120, 0, 0]),
        bleu=None,
        measured=measured,
    )
    rounds = [r1, r2]
    if evaluated:
        rounds.insert(0, {"round": 0, "val_bleu": 0.0, "val_loss": 9.0, "val_examples": 16.0, "elapsed_s": 1.0})
    return rounds


def write_rounds(run: Path, records, tail: str = "") -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "rounds.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records) + tail)
    return run


def assert_png(path: Path, width: int = 640) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[1] == width and image.shape[2] in (3, 4), image.shape
    assert image.min() < image.max()  # something was drawn


def test_a_full_run_gets_the_four_figures(tmp_path):
    run = write_rounds(tmp_path / "run", hand_rounds())
    written = write_run_plots(run)
    assert written == [run / "plots" / name for name in ALL]
    for path in written:
        assert_png(path)  # 6.4 in at 100 dpi
        assert path.stat().st_size < 200_000
    assert matplotlib.image.imread(run / "plots" / "delay.png").shape[0] == 720  # two panels: modelled, measured
    assert matplotlib.image.imread(run / "plots" / "metric.png").shape[0] == 720  # bleu and val loss
    assert sorted(p.name for p in (run / "plots").iterdir()) == sorted(ALL)  # no temporary files left


def test_plots_without_data_are_skipped(tmp_path):
    run = write_rounds(tmp_path / "run", hand_rounds(evaluated=False, measured=False, memory=False))
    written = write_run_plots(run)
    assert [p.name for p in written] == ["loss.png", "delay.png"]
    assert not (run / "plots" / "metric.png").exists() and not (run / "plots" / "memory.png").exists()
    assert matplotlib.image.imread(run / "plots" / "delay.png").shape[0] == 360  # modelled panel only

    # no modelled plan and no measured times: no delay figure either
    bare = [{k: v for k, v in r.items() if k not in ("plan", "modelled")} for r in hand_rounds(measured=False)]
    run = write_rounds(tmp_path / "bare", bare)
    assert [p.name for p in write_run_plots(run)] == ["loss.png", "metric.png", "memory.png"]

    # a folder without rounds.jsonl (or only torn lines): nothing drawn, no plots folder
    assert write_run_plots(tmp_path / "empty") == []
    run = write_rounds(tmp_path / "torn_only", [], tail='{"round": 1, "train_lo')
    assert write_run_plots(run) == [] and not (run / "plots").exists()


def test_a_torn_last_line_is_tolerated(tmp_path):
    records = hand_rounds()
    run = write_rounds(tmp_path / "run", records, tail='{"round": 3, "train_loss": 7.')
    assert [r["round"] for r in load_rounds(run)] == [0, 1, 2]
    assert [p.name for p in write_run_plots(run)] == ALL
    # a torn line in the middle (the next append starts a new line, as RunLog does) and a non-record line
    text = json.dumps(records[0]) + "\n" + '{"round": 1, "tr\n' + "42\n" + json.dumps(records[2]) + "\n"
    (run / "rounds.jsonl").write_text(text)
    assert [r["round"] for r in load_rounds(run)] == [0, 2]


def test_the_golden_run_draws_loss_metric_and_delay(tmp_path):
    run = tmp_path / "golden"
    run.mkdir()
    shutil.copy(GOLDEN, run / "rounds.jsonl")
    # the golden file has no wall-clock fields: no memory report, delay has the modelled panel only
    assert [p.name for p in write_run_plots(run)] == ["loss.png", "metric.png", "delay.png"]
    assert_png(run / "plots" / "metric.png")


def test_the_metric_is_the_records_or_the_one_asked_for(tmp_path):
    records = hand_rounds()
    for r in records:
        if "val_bleu" in r:
            r["val_f1"] = r.pop("val_bleu")
    run = write_rounds(tmp_path / "f1", records)
    write_run_plots(run)
    assert matplotlib.image.imread(run / "plots" / "metric.png").shape[0] == 720  # f1 and val loss
    # asked for a metric the records lack: only the val-loss panel remains
    write_run_plots(run, metric="accuracy")
    assert matplotlib.image.imread(run / "plots" / "metric.png").shape[0] == 360


def test_round_scalars_are_the_records_values():
    r0, r1, r2 = hand_rounds()
    assert round_scalars(r0) == {"val/bleu": 0.0, "val/loss": 9.0, "val/examples": 16.0}
    got = round_scalars(r1)
    want = {
        "train/loss": 8.5,
        "train/loss/cu0": 8.6,
        "train/loss/cu1": 8.4,
        "val/bleu": 0.25,
        "val/loss": 9.0,
        "val/examples": 16.0,
        # bottleneck CU1: 3 + 1 + 5 = 9 s
        "delay/round_s": 9.0,
        "delay/compute_s": 3.0,
        "delay/d2d_s": 1.0,
        "delay/uplink_s": 5.0,
        # devices 0.25 + 0.5, CUs 3 + 4
        "energy/device_j": 0.75,
        "energy/cu_j": 7.0,
        "energy/total_j": 7.75,
        "measured/plan_s": 0.01,
        "measured/wait_clients_s": 1.5,
        "measured/aggregate_s": 0.02,
        "measured/round_s": 2.0,
        # idle devices (0 bytes) report nothing
        "memory/cu0/device0_mib": 100.0,
        "memory/cu1/device1_mib": 50.0,
        "memory/cu1/device2_mib": 25.0,
        "failures": 0.0,
    }
    assert got.keys() == want.keys()
    for tag, value in want.items():
        assert got[tag] == pytest.approx(value), tag
    got = round_scalars(r2)  # CU1 not selected: its 99 s delay and 18 J are left out
    assert got["delay/round_s"] == pytest.approx(3.5) and got["delay/uplink_s"] == pytest.approx(2.0)
    assert got["energy/total_j"] == pytest.approx(1.125)
    assert "train/loss/cu1" not in got and "val/bleu" not in got
    assert got["memory/cu0/device0_mib"] == pytest.approx(120.0)
    failed = dict(r2, failures=[{"cluster": 1, "error": "device lost"}], train_loss=float("nan"))
    failed_scalars = round_scalars(failed)
    assert failed_scalars["failures"] == 1.0 and "train/loss" not in failed_scalars


def test_tensorboard_without_the_package_is_a_one_line_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when not installed
    with pytest.raises(ConfigError, match="pip install tensorboard") as err:
        TensorBoardLog(tmp_path / "tb")
    assert "\n" not in str(err.value)
    run = write_rounds(tmp_path / "run", hand_rounds())
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        write_tensorboard(run)
    assert not (run / "tensorboard").exists()


def test_tensorboard_writes_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = write_rounds(tmp_path / "run", hand_rounds())
    folder = write_tensorboard(run)
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 8.5), (2, 8.0)]
    assert [e.step for e in events.Scalars("val/bleu")] == [0, 1]
