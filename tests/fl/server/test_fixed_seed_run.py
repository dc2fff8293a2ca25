"""A fixed-seed federation behaves as it did before the architecture refactor (issue 11).

The whole server (``run_server``: strategy, planner, data plane, aggregation, evaluation) and the real CU
handlers run in this process (``tests/inprocess_grid.py``; CUs answer in node order, so the run is
deterministic). ``golden/rounds_translation_tiny_seed0.jsonl`` is the rounds.jsonl of the same run made by
the code before the refactor (commit 7e9a467), with wall-clock fields left out: losses per step, plans,
modelled delays and validation metrics must match it up to float noise.
"""

from __future__ import annotations

import json
import math

import pytest

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config
from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid
from tests.paths import GOLDEN_DIR

pytestmark = pytest.mark.e2e

GOLDEN = GOLDEN_DIR / "rounds_translation_tiny_seed0.jsonl"
OVERRIDES = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=3 "
    "federation.local_steps=2 runtime.backend=local runtime.precision=fp32 task.batch_size=8 eval.max_examples=16 "
    "eval.every=1 eval.at_start=true run_name=fixed "
    # the models the golden run was made with: no per-micro-batch cost c0, Sub-1's m capped at 8 and the
    # convergence constants before Gamma^max was calibrated (the golden file pins behaviour, not the defaults)
    "network.device.per_microbatch_s=0 scheduler.max_m=8 scheduler.convergence.grad_bound=1.0 "
    "scheduler.convergence.interference_c=0.01 scheduler.convergence.gamma_max=0.01 "
    # batches padded to their longest sequence, as then (a wider batch draws other dropout masks)
    "task.pad_multiple=1 "
    # torch's dropout kernel, as then (models/fast_dropout.py draws other masks from the same generator)
    "model.dropout_kernel=torch"
)
# fields that differ between any two runs: times, and where the processes ran (pids, network namespaces)
# and what the devices' memory measured (the record's memory section, the limits: issue 43, after the golden run),
# and the virtual clock (issue 63, after the golden run: CPU seconds measured per call, so timings too), and which
# device k each process is (device-pid-devices, issue 64, after the golden run)
WALL_CLOCK = (
    "seconds",
    "elapsed",
    "measured",
    "pids",
    "pid-devices",
    "netns",
    "device-compute",
    "device-link",
    "peak",
    "memory",
    "virtual",
)


def _behaviour(value, key: str = ""):
    """The record without wall-clock and process fields (they differ between any two runs)."""
    if isinstance(value, dict):
        return {k: _behaviour(v, k) for k, v in value.items() if not any(w in k for w in WALL_CLOCK)}
    if isinstance(value, list):
        return [_behaviour(v, key) for v in value]
    return value


def _assert_close(got, want, path: str = "$") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys {sorted(set(got) ^ set(want))}"
        for k in want:
            _assert_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{path}: length"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) or isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-7), f"{path}: {got} != {want}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def _check_virtual_clock(records: list[dict]) -> None:
    """The virtual clock of every trained round (issue 63): each cluster's device path is at least its busiest
    device's own work (a device runs its calls one after another) and at most all its devices' work end to end;
    the round is the slowest cluster plus the server's part."""
    for record in records[1:]:
        virtual = record["virtual"]
        for n, row in virtual["clusters"].items():
            busy = row["device_s"]
            assert max(busy) > 0 and max(busy) <= row["compute_s"] + 1e-9 <= sum(busy) + 1e-6, (n, row)
            assert row["total_s"] >= row["compute_s"] + row["decoder_s"]
        slowest = max(row["total_s"] for row in virtual["clusters"].values())
        assert virtual["round_s"] == slowest + virtual["server_s"]


def test_fixed_seed_rounds_match_the_pre_refactor_run(data_dir, tmp_path):
    run_config = {"overrides": OVERRIDES, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    lines = (folder / "rounds.jsonl").read_text().splitlines()
    _check_virtual_clock([json.loads(line) for line in lines])
    got = [_behaviour(json.loads(line)) for line in lines]
    want = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    assert [r["round"] for r in got] == [0, 1, 2, 3]
    # the partitions a record holds since the golden file was made: each CU's |D_n| as the task splits it
    cfg = load_run_config(OVERRIDES.split(), data_dir=str(data_dir))
    task = wiring.build_task(cfg)
    sizes = {str(n): len(wiring.client_partition(task, cfg, n, 2)) for n in range(2)}
    for record in got[1:]:
        parts = record.pop("partitions")
        assert {n: p["examples"] for n, p in parts.items()} == sizes
        assert all(sum(p["labels"]) == p["examples"] for p in parts.values())
    # the bytes each CU's reply carried, recorded since the golden file was made: the same model every round
    uploads = {c.pop("upload-bytes") for r in got[1:] for c in r["clients"].values()}
    assert len(uploads) == 1 and uploads.pop() > 0
    _assert_close(got, want)
    # the run trained: every CU's loss fell over its six steps
    for cluster in ("0", "1"):
        losses = [x for r in got[1:] for x in r["clients"][cluster]["train-losses"]]
        assert losses[-1] < losses[0]
