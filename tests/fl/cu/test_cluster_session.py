"""A CU keeps its state across the rounds of a run (issue: stateful CUs).

- Ray backend, two rounds with a re-partition between them: the same device actor processes serve both
  rounds (their pids do not change), and the CU's losses equal plain single-process training of the whole
  model with one optimizer over both rounds (the reference knows nothing of pipelines or sessions).
- ``federation.optimizer_state``: after two one-step rounds, the weights equal two Adam steps computed by
  hand from the plain model's gradients (``keep``), or one fresh Adam step from the round-1 weights
  (``reset``); ``keep`` still holds when round 2 lands in another CU process (state from Context.state).

A CU process is its state store (fl/cu/state_store.py): a round "in another process" is a round with another
``CUStateStore``, which shares nothing with the first.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from flwr.app import RecordDict

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, release_run, run_key_of, train_round
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import TrainInstructions, pack_weights, unpack_weights
from collapipe_flwr.fl.server.server_state import ServerState
from tests.fold_replies import absorb_replies
from tests.plain_reference import plain_losses

STEPS = 3


def _plan(delta) -> ClusterPlan:
    return ClusterPlan(
        cluster=0, selected=True, channel=0, power_w=0.1, S=sum(1 for d in delta if d), m=2, delta=tuple(delta)
    )


def _instructions(cfg, server, t, delta) -> TrainInstructions:
    return server.instructions_for(t, _plan(delta))


@pytest.mark.e2e
@pytest.mark.slow  # the README's test command leaves it out (docs/development.md); the full suite runs it
def test_ray_actors_live_across_rounds_and_processes_and_training_equals_the_plain_model(data_dir):
    cfg = load_run_config(
        [
            "task=translation",
            "model=transformer_tiny",
            "model.enc_layers=4",
            "federation=tiny",
            "network=small",
            "federation.num_clusters=1",
            f"federation.local_steps={STEPS}",
            "runtime.backend=ray",
            "task.batch_size=8",
            "model.dropout=0.0",
            "runtime.precision=fp32",
            "model.lr_schedule.warmup_steps=4",
            "model.lr_schedule.decay=linear",
        ],
        data_dir=str(data_dir),
    )
    server = ServerState.build(cfg)
    identity = ClusterIdentity(0, 1, str(data_dir))
    state = RecordDict()
    metrics = []
    first_process, second_process = CUStateStore(), CUStateStore()
    try:
        weights = server.global_model.array_record()
        # round 2 moves blocks and adds a device, in a CU process that did not run round 1; round 3 runs in
        # the first process again, whose session still believes round 1's partition
        for t, delta, process in (
            (1, (1, 3, 0), first_process),
            (2, (2, 1, 1), second_process),
            (3, (0, 1, 3), first_process),
        ):
            server.decoder.open_round(t, [0])
            record, m = train_round(process, identity, weights, _instructions(cfg, server, t, delta), state=state)
            m = m.to_record()  # the report as it travels (RoundReport.to_record)
            server.decoder.close_round()
            metrics.append(m)
            absorb_replies(server, t, [(0, unpack_weights(record), m)])
            weights = server.global_model.array_record()
    finally:
        released = release_run(
            first_process, identity, run_key_of(cfg.cluster_config().with_data_dir(str(data_dir)), None), 3
        )
        server.shutdown()
    task = wiring.build_task(cfg)
    expected = plain_losses(cfg, task, wiring.client_partition(task, cfg, 0, 1), rounds=3)
    got = [loss for m in metrics for loss in m["train-losses"]]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert expected[-1] < expected[0]
    # the same three actor processes serve the cluster in every round (all K started in round 1, the idle
    # one without blocks), whichever CU process drives them
    first, second, third = (m["device-pids"] for m in metrics)
    assert len(first) == 3 and first == second == third and os.getpid() not in first
    assert metrics[0]["device-pid-devices"] == [0, 1, 2]  # which device k each pid is (the run's memory reads it)
    assert metrics[1]["pipeline-reused"] == 0 and metrics[1]["optimizer-restored"] == 1  # a fresh process
    assert metrics[2]["pipeline-reused"] == 1 and metrics[2]["blocks-moved"] == 1
    assert released == 3  # the run's end kills every device actor of the cluster


def _bert_tiny_cfg(data_dir, *overrides: str):
    """One cluster of bert_tiny classification on the in-process backend, with ``overrides`` on top."""
    return load_run_config(
        [
            "task=classification",
            "model=bert_tiny",
            "federation=tiny",
            "network=small",
            "federation.num_clusters=1",
            "runtime.backend=local",
            "task.batch_size=8",
            *overrides,
        ],
        data_dir=str(data_dir),
    )


def _vanilla_cfg(data_dir, optimizer_state: str):
    return _bert_tiny_cfg(
        data_dir,
        "method=vanilla_fl",
        "federation.local_steps=1",
        "model.dropout=0.0",
        "runtime.precision=fp32",
        f"federation.optimizer_state={optimizer_state}",
    )


def _grads(cfg, task, parts, batch) -> dict[str, dict[str, torch.Tensor]]:
    """Gradients of the plain model (all three parts in one process) at ``parts`` on ``batch``."""
    model = wiring.build_model(task, cfg)
    mods = {"embedding": model.embedding, "encoder": model.blocks, "head": model.head}
    for part, mod in mods.items():
        mod.load_state_dict(parts[part])
        mod.train()
    loss_sum, count = model.loss_terms(batch)
    (loss_sum / count).backward()
    return {part: {n: p.grad.detach().clone() for n, p in mod.named_parameters()} for part, mod in mods.items()}


def _adam_by_hand(w, grads: list[torch.Tensor], lr: float, b1: float, b2: float, eps: float = 1e-8):
    """Adam (Kingma & Ba, Algorithm 1) from zero moments over the given gradients, in float64."""
    w = w.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    return w


@pytest.mark.e2e
@pytest.mark.parametrize("optimizer_state,other_process", [("keep", False), ("keep", True), ("reset", False)])
def test_optimizer_state_keep_and_reset_match_adam_by_hand(data_dir, optimizer_state, other_process):
    cfg = _vanilla_cfg(data_dir, optimizer_state)
    server = ServerState.build(cfg)
    identity = ClusterIdentity(0, 1, str(data_dir))
    task = wiring.build_task(cfg)
    indices = wiring.client_partition(task, cfg, 0, 1)
    batches = [
        next(iter(wiring.partition_batches(task, cfg, indices, seed=wiring.round_seed(cfg, t, 0)))) for t in (1, 2)
    ]
    w0 = unpack_weights(server.global_model.array_record())
    state = RecordDict()
    process = CUStateStore()
    try:
        rec1, _ = train_round(
            process, identity, pack_weights(w0), _instructions(cfg, server, 1, (2, 0, 0)), state=state
        )
        w1 = unpack_weights(rec1)
        if other_process:  # round 2 runs in a CU process that never saw round 1
            process = CUStateStore()
        rec2, m2 = train_round(
            process, identity, pack_weights(w1), _instructions(cfg, server, 2, (2, 0, 0)), state=state
        )
        m2 = m2.to_record()  # the report as it travels (RoundReport.to_record)
        w2 = unpack_weights(rec2)
    finally:
        release_run(process, identity, run_key_of(cfg.cluster_config().with_data_dir(str(data_dir)), None), 3)
        server.shutdown()
    g1 = _grads(cfg, task, w0, batches[0])
    g2 = _grads(cfg, task, w1, batches[1])
    spec = wiring.optimizer_spec(cfg)
    b1, b2 = spec.betas
    assert m2["optimizer-restored"] == int(optimizer_state == "keep" and other_process)
    checked = 0
    for part in ("embedding", "encoder", "head"):
        for name, g in g2[part].items():
            if part == "embedding" and g.abs().sum() == 0:
                continue  # rows no batch touched: Adam keeps moving them from round 1's moments
            if optimizer_state == "keep":
                expected = _adam_by_hand(w0[part][name], [g1[part][name], g], spec.lr, b1, b2)
            else:
                expected = _adam_by_hand(w1[part][name], [g], spec.lr, b1, b2)
            torch.testing.assert_close(w2[part][name].double(), expected, rtol=1e-4, atol=2e-6)
            checked += 1
    assert checked > 10
    # the two choices really differ on this data (so the comparison is not vacuous)
    if optimizer_state == "reset":
        name = next(iter(g2["head"]))
        keep = _adam_by_hand(w0["head"][name], [g1["head"][name], g2["head"][name]], spec.lr, b1, b2)
        assert not torch.allclose(keep, w2["head"][name].double(), rtol=1e-4, atol=2e-6)
    assert math.isfinite(m2["train-loss"])


@pytest.mark.parametrize("method", ["collapipe", "vanilla_fl"])
def test_a_cu_session_keeps_only_the_parts_the_cu_trains(data_dir, method):
    """Once the pipeline holds the TEBs, the CU's session keeps no copy of them, nor of a head the server
    trains: its parameters are the embedding's (and a CU-side head's), counted on a separately built model,
    while the pipeline still gives back the encoder it was loaded with."""
    cfg = _bert_tiny_cfg(data_dir, f"method={method}")
    task = wiring.build_task(cfg)
    reference = wiring.build_model(task, cfg)
    parts = {"embedding": reference.embedding.state_dict(), "encoder": reference.blocks.state_dict()}
    expected = sum(p.numel() for p in reference.embedding.parameters())
    if method == "vanilla_fl":  # VanillaFL trains the head on the CU
        parts["head"] = reference.head.state_dict()
        expected += sum(p.numel() for p in reference.head.parameters())
    server = ServerState.build(cfg)
    devices = server.planner.devices_of(0)
    server.shutdown()
    ccfg = cfg.cluster_config().with_data_dir(str(data_dir))
    store = CUStateStore()
    session = store.session_for("release-test", 0, 1, ccfg)
    try:
        session.prepare(1, parts, (2, 0, 0), devices, ())
        held = session.model.embedding, session.model.blocks, session.model.head
        assert sum(p.numel() for mod in held for p in mod.parameters()) == expected
        encoder = session.live_pipeline().encoder_state_dict()
        assert encoder.keys() == parts["encoder"].keys()
        for name, value in parts["encoder"].items():
            torch.testing.assert_close(encoder[name], value)
        with pytest.raises(RuntimeError, match="released its copy of the encoder blocks"):
            list(session.model.blocks)
    finally:
        store.drop_session("release-test", 0, 3)
