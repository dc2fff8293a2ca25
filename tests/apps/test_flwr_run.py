"""End to end: `flwr run .` as a simulation with 2 CUs and 2 rounds of a tiny Transformer on Multi30K.

Checks that the run exits 0, that training loss falls, and that the global encoder after each round is
the example-weighted mean of the encoders the CUs returned (recomputed here independently of
collapipe_flwr.fl.aggregation).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.flower_env import ROOT, flower_env, local_simulation_config, run, stop_local_superlink, write_flower_config

pytestmark = pytest.mark.e2e

OVERRIDES = (
    "task=translation model=transformer_tiny federation=tiny network=small scheduler=dssra "
    "save_client_weights=true eval.max_examples=32 run_name=e2e federation.local_steps=6"
)


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("flwr_run")
    home, out = tmp / "flwr_home", tmp / "runs"
    write_flower_config(home, local_simulation_config(2))
    env = flower_env(home, data_dir)
    run_config = f'overrides="{OVERRIDES}" output-dir="{out}"'
    try:
        proc = run(["flwr", "run", ".", "--stream", "--run-config", run_config], env, ROOT, timeout=900)
    finally:
        stop_local_superlink(home)
    return proc, out / "e2e"


def _rounds(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


def test_run_exits_zero_and_loss_falls(e2e_run):
    proc, folder = e2e_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = [r for r in _rounds(folder) if r["round"] >= 1]
    assert [r["round"] for r in rounds] == [1, 2], proc.stdout[-3000:]
    first = [c["train-losses"][0] for c in rounds[0]["clients"].values()]
    last = [c["train-losses"][-1] for c in rounds[-1]["clients"].values()]
    assert sum(last) / len(last) < sum(first) / len(first)
    assert all("bleu" in k or k.startswith("val_") for k in rounds[-1] if k.startswith("val_"))


def test_global_encoder_is_example_weighted_mean(e2e_run):
    proc, folder = e2e_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    for t in (1, 2):
        clients = [torch.load(p, weights_only=True) for p in sorted((folder / "weights").glob(f"round{t}_cluster*.pt"))]
        assert len(clients) == 2
        glob = torch.load(folder / "weights" / f"round{t}_global.pt", weights_only=True)["parts"]
        n = [c["num_examples"] for c in clients]
        for part in ("embedding", "encoder"):
            for name, value in glob[part].items():
                if not torch.is_floating_point(value):
                    continue
                expected = sum(c["parts"][part][name].double() * w for c, w in zip(clients, n)) / sum(n)
                torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
        # the returned encoders really differ, so the check above is not vacuous
        a, b = (c["parts"]["encoder"] for c in clients)
        assert any(not torch.equal(a[k], b[k]) for k in a)


def test_saved_model_reproduces_the_logged_validation_metric(e2e_run):
    """The run's saved model (runs/<name>/model/), evaluated by `python -m collapipe_flwr.apps.evaluate`, gives
    the validation BLEU the run logged for its last round."""
    from collapipe_flwr.apps import evaluate

    proc, folder = e2e_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [r for r in _rounds(folder) if "val_bleu" in r][-1]["val_bleu"]
    metrics = evaluate.main([str(folder)])
    assert metrics["bleu"] == pytest.approx(logged, abs=1e-6)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["model_dir"] == str(folder / "model")
