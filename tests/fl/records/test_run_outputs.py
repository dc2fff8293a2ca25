"""What one run leaves for a person to read: the console lines, summary.json's totals, the plots and the
TensorBoard scalars, checked against the run's own rounds.jsonl (the record every other output derives from).

The whole server and the real CU handlers run in this process (tests/inprocess_grid.py)."""

from __future__ import annotations

import json
import math

import pytest

from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid

pytestmark = pytest.mark.e2e

OVERRIDES = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
    "federation.local_steps=2 runtime.backend=local task.batch_size=8 eval.max_examples=16 run_name=outputs "
    "tensorboard=true"
)


def test_a_run_writes_console_summary_plots_and_tensorboard(data_dir, tmp_path, capfd):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    run_config = {"overrides": OVERRIDES, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    records = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["round"] >= 1]
    summary = json.loads((folder / "summary.json").read_text())

    # summary.json: totals are the sums over the rounds' records, the plots are there
    assert math.isclose(summary["modelled_delay_s"], sum(r["modelled"]["round_delay_s"] for r in trained), rel_tol=1e-3)
    assert math.isclose(summary["measured_round_s"], sum(r["measured_s"]["round_s"] for r in trained), rel_tol=1e-3)
    plots = ["delay.png", "loss.png", "memory.png", "metric.png", "partitions.png"]
    assert sorted(p.split("/")[-1] for p in summary["plots"]) == plots

    # every record holds each cluster's partition: its size and its examples per label, which add up to it
    for record in trained:
        parts = record["partitions"]
        assert sorted(parts) == ["0", "1"] and all(sum(p["labels"]) == p["examples"] > 0 for p in parts.values())
    assert all((folder / "plots" / name).stat().st_size > 1000 for name in ("loss.png", "delay.png"))

    # TensorBoard: the per-round train loss as logged in rounds.jsonl
    events = event_accumulator.EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("train/loss")}
    assert sorted(logged) == [1, 2]
    for r in trained:
        assert logged[r["round"]] == pytest.approx(r["train_loss"], rel=1e-6)

    # the console: the start line first, then one line per round start / end, the summary last
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith("CollaPipe: translation / transformer_tiny, method collapipe (scheduler dssra), 2 CUs")
    assert [line for line in lines if line.startswith("round 2/2 done")][0].startswith(
        f"round 2/2 done | train loss {trained[1]['train_loss']:.4f} | val bleu"
    )
    assert lines[-1] == f"evaluate again: python -m collapipe_flwr.apps.evaluate {folder}"
