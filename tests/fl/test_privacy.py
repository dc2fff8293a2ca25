"""Differential privacy on the CUs' uploads (privacy.mode, docs/privacy.md), checked against the mechanisms' own
definitions: a clipped update's L2 norm is at most C (Flower's mods, through the ClientApp's privacy mod, in a
whole in-process run), central noise has sigma = z C / n and is reproducible by seed, local noise has
sigma = C sqrt(2 ln(1.25 / delta)) / epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, RecordDict
from safetensors.torch import load_file

from collapipe_flwr.config import PrivacySpec, load_run_config
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.cu.privacy_mod import privacy_mod
from collapipe_flwr.fl.messages import INSTRUCTIONS, WEIGHTS
from collapipe_flwr.fl.server.aggregation.central_dp import add_central_noise, noise_sigma
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.fl.server.server_state import ServerState
from tests.inprocess_grid import InProcessGrid

OVERRIDES = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=1 "
    "federation.local_steps=3 runtime.backend=local task.batch_size=8 eval.max_examples=16 checkpoint=false"
)


def _global_change(data_dir, tmp_path, name: str, privacy: str) -> float:
    """||theta^1 - theta^0|| of the uploaded parts (embedding + encoder) after one round of two CUs."""
    overrides = f"{OVERRIDES} run_name={name} {privacy}"
    run_config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    cfg = load_run_config(overrides.split(), data_dir=str(data_dir), output_dir=str(tmp_path))
    start = ServerState.build(cfg)  # the same seed builds the same initial model
    before = {"embedding": start.model.embedding.state_dict(), "encoder": start.model.blocks.state_dict()}
    start.shutdown()
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    total = 0.0
    for part, state in before.items():
        after = load_file(folder / "model" / f"{part}.safetensors")
        total += sum(float(((after[k].double() - v.double()) ** 2).sum()) for k, v in state.items())
    return math.sqrt(total)


@pytest.mark.e2e
@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_clipping_bounds_the_global_change_by_c_and_without_dp_it_is_larger(data_dir, tmp_path):
    """Each CU's update clipped to C (Flower's fixedclipping_mod behind the ClientApp's mod): their weighted mean,
    the round's change of the global model under FedAvg without noise (z = 0), has a norm of at most C."""
    c = 1e-3
    clipped = _global_change(
        data_dir, tmp_path, "clipped", f"privacy=central privacy.clipping_norm={c} privacy.noise_multiplier=0"
    )
    free = _global_change(data_dir, tmp_path, "free", "privacy=none")
    assert clipped <= c * (1 + 1e-4)
    assert free > 20 * c  # the bound is doing the work


def test_central_noise_has_sigma_z_c_over_n_and_is_reproducible():
    privacy = PrivacySpec(mode="central", clipping_norm=0.5, noise_multiplier=0.8)
    assert noise_sigma(privacy, 4) == pytest.approx(0.8 * 0.5 / 4)
    zeros = {"a": torch.zeros(400_000), "steps": torch.zeros(3, dtype=torch.long)}
    noisy = add_central_noise(zeros, privacy, 4, seed=3, round_=2)
    assert float(noisy["a"].std()) == pytest.approx(0.1, rel=0.01) and abs(float(noisy["a"].mean())) < 1e-3
    assert torch.equal(noisy["steps"], zeros["steps"])  # integer tensors are left alone
    assert torch.equal(noisy["a"], add_central_noise(zeros, privacy, 4, seed=3, round_=2)["a"])
    assert not torch.equal(noisy["a"], add_central_noise(zeros, privacy, 4, seed=3, round_=3)["a"])


def _train_message(privacy: dict, sent: np.ndarray) -> Message:
    from collapipe_flwr.dssra.plan import ClusterPlan
    from collapipe_flwr.fl.messages import TrainInstructions, train_content

    plan = ClusterPlan(cluster=0, selected=True, channel=0, power_w=0.1, S=1, m=1, delta=(2,))
    overrides = [f"privacy.{key}={value}" for key, value in privacy.items()]
    cluster_config = load_run_config(overrides).cluster_config()
    instructions = TrainInstructions(round=1, plan=plan, cluster_config=cluster_config, devices=[])
    weights = ArrayRecord({"encoder.w": Array(sent)})
    return Message(train_content(weights, instructions), dst_node_id=1, message_type=MessageType.TRAIN)


@pytest.fixture
def in_a_run(monkeypatch):
    from collapipe_flwr.flower_internals import TaskIdentity

    for key, value in (("run_id", 1), ("node_id", 1), ("task_id", 1)):
        monkeypatch.setattr(TaskIdentity, f"_{key}", value, raising=False)


def _replying(update: np.ndarray):
    def handler(msg: Message, context: Context) -> Message:
        sent = msg.content.array_records[WEIGHTS]["encoder.w"].numpy()
        return Message(RecordDict({WEIGHTS: ArrayRecord({"encoder.w": Array(sent + update)})}), reply_to=msg)

    return handler


def test_local_dp_clips_then_adds_its_gaussian_noise(in_a_run):
    rng = np.random.default_rng(0)
    sent = rng.normal(size=200_000).astype(np.float32)
    update = rng.normal(size=200_000).astype(np.float32)  # norm ~ 447, clipped to C = 2
    privacy = {"mode": "local", "clipping_norm": 2.0, "noise_multiplier": 1.0, "epsilon": 50.0, "delta": 1e-5}
    msg = _train_message(privacy, sent)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    reply = privacy_mod(msg, context, _replying(update))
    got = reply.content.array_records[WEIGHTS]["encoder.w"].numpy().astype(np.float64)
    noise = got - sent - update * (2.0 / np.linalg.norm(update.astype(np.float64)))
    sigma = 2.0 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 50.0
    assert PrivacySpec(**privacy).local_sigma() == pytest.approx(sigma)
    assert float(noise.std()) == pytest.approx(sigma, rel=0.02) and abs(float(noise.mean())) < 3 * sigma / 400


def test_central_mode_puts_c_in_the_train_message_and_clips_on_the_cu(in_a_run):
    from collapipe_flwr.flower_internals import KEY_CLIPPING_NORM

    sent = np.zeros(1000, dtype=np.float32)
    update = np.full(1000, 0.5, dtype=np.float32)  # norm 15.8
    privacy = {"mode": "central", "clipping_norm": 3.0, "noise_multiplier": 1.0, "epsilon": 1.0, "delta": 1e-5}
    msg = _train_message(privacy, sent)
    assert msg.content.config_records[INSTRUCTIONS][KEY_CLIPPING_NORM] == 3.0
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    got = privacy_mod(msg, context, _replying(update)).content.array_records[WEIGHTS]["encoder.w"].numpy()
    assert float(np.linalg.norm(got)) == pytest.approx(3.0, rel=1e-5)  # no noise on the CU: the server adds it


@pytest.mark.parametrize(
    "override,needle",
    [
        ("privacy.mode=secret", "privacy.mode='secret' must be one of none, local, central"),
        ("privacy=central privacy.clipping_norm=0", "privacy.clipping_norm=0.0 must be a finite number > 0"),
        ("privacy=local privacy.delta=1.5", "privacy.delta=1.5 must be a number in (0, 1)"),
        ("privacy=central federation.embedding=frozen", "needs the embedding returned"),
    ],
)
def test_bad_privacy_settings_are_one_line_errors(override, needle, data_dir):
    with pytest.raises(ConfigError) as err:
        load_run_config(override.split(), data_dir=str(data_dir))
    assert needle in str(err.value) and "\n" not in str(err.value)
