"""The per-step data plane (issue 3): a remote step through DecoderHost/DecoderClient on loopback must
equal head_step run in-process, keep the decoder consistent under concurrent CUs, and refuse every
malformed request without touching the decoder's weights or optimizer state.

Refusals, broken peers, the wire codec, keys and limits: the test_dataplane_*.py files beside it."""

from __future__ import annotations

import copy
import math
import threading

import pytest
import torch
from torch import nn

from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.wire import to_wire_fp16
from collapipe_flwr.fl.server.decoder.host import DecoderHost
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import (
    SECRET,
    C,
    SequenceHead,
    Served,
    TokenHead,
    assert_same_state,
    make_step,
    snapshot,
)


# ---------------------------------------------------------------------------------------------------
# equivalence with the in-process head step
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_cls,sequence", [(TokenHead, False), (SequenceHead, True)])
def test_remote_step_equals_in_process_head_step(head_cls, sequence, transport):
    s = Served(head_cls(), transport=transport)
    try:
        with s.client(0) as client:
            for step in range(3):
                z, mbs = make_step(step, m=1 + step % 3, sequence=sequence)
                z_before = [t.clone() for t in z]
                loss, grads = client(z, mbs)
                ref_loss, ref_grads = head_step(s.ref_head, s.ref_optimizer, [t.clone() for t in z], mbs)
                assert abs(loss - ref_loss) <= 1e-6
                assert len(grads) == len(ref_grads)
                for g, rg, zb, zz in zip(grads, ref_grads, z_before, z):
                    assert g.dtype == torch.float32 and g.shape == rg.shape
                    torch.testing.assert_close(g, rg, atol=1e-6, rtol=0)
                    assert torch.equal(zb, zz)  # the client does not modify the caller's activations
                for (name, p), rp in zip(s.head.named_parameters(), s.ref_head.parameters()):
                    assert torch.equal(p, rp), name
        assert_same_state(snapshot(s.head, s.optimizer), snapshot(s.ref_head, s.ref_optimizer))
        assert s.host.address == f"127.0.0.1:{s.host.port}"
        stats = s.host.stats()["clusters"][0]
        assert stats["steps"] == 3 and stats["refused"] == 0 and stats["bytes_in"] > 0 and stats["bytes_out"] > 0
    finally:
        s.host.stop(grace_s=0)


def test_loss_is_plain_mean_over_the_whole_batch(served, transport):
    """Independent check of loss scaling: the remote loss equals the unsplit model's mean token loss."""
    z, mbs = make_step(11, b=6, m=3)
    logits = [served.ref_head.out(torch.tanh(served.ref_head.proj(t))) for t in z]
    labels = torch.cat([mb["labels"] for mb in mbs])
    plain = nn.functional.cross_entropy(torch.cat(logits).reshape(-1, C), labels.reshape(-1), ignore_index=-100)
    with served.client(0) as client:
        loss, _ = client(z, mbs)
    assert abs(loss - float(plain.detach())) <= 1e-6


def test_fp16_wire_round_trip_error_bound():
    """Scaled float16 keeps every value within float16's rounding (2**-11 relative, 2**-38 * max abs
    in the subnormal range), also for magnitudes plain .half() turns into inf or 0."""
    g = torch.Generator().manual_seed(3)
    for magnitude in (1e-9, 1e-6, 1.0, 1e5):
        x = torch.randn(4, 8, 16, generator=g) * magnitude
        half, scale = to_wire_fp16(x)
        assert half.dtype == torch.float16 and math.log2(scale).is_integer()
        back = half.float() / scale
        bound = 2.0**-11 * x.abs() + 2.0**-38 * float(x.abs().max())
        assert bool(((back - x).abs() <= bound).all()), magnitude
    big = torch.full((3,), 1e5)
    assert not bool(torch.isfinite(big.half()).all())  # why the scale exists
    assert bool(torch.isfinite(to_wire_fp16(big)[0]).all())


def test_fp16_remote_step_close_to_fp32(transport):
    """fp16 on the wire perturbs z_enc and the gradients by float16 rounding (relative 2**-11 ~ 5e-4 per
    value). The head is smooth, so loss and gradients move by a few times that: 2e-3 relative. The head steps with
    SGD here, so each parameter moves by lr times its gradient and the rounding shows in it as it is: Adam divides
    each gradient by its own running size, so the rounding of a gradient near 0 moves that parameter by a part of
    lr, and the comparison of the parameters then depends on which elements happen to be near 0 (a CI run's thread
    settings made one element of 256 differ by 1.5e-4)."""
    s = Served(TokenHead(), compression="fp16", transport=transport, optimizer=torch.optim.SGD)
    try:
        with s.client(0, compression="fp16") as client:
            for step in range(2):
                z, mbs = make_step(20 + step, m=2)
                loss, grads = client(z, mbs)
                ref_loss, ref_grads = head_step(s.ref_head, s.ref_optimizer, z, mbs)
                assert abs(loss - ref_loss) <= 2e-3 * abs(ref_loss)
                for g, rg in zip(grads, ref_grads):
                    assert g.dtype == torch.float32
                    assert float((g - rg).abs().max()) <= 2e-3 * float(rg.abs().max())
        for p, rp in zip(s.head.parameters(), s.ref_head.parameters()):
            torch.testing.assert_close(p, rp, atol=1e-4, rtol=1e-3)
    finally:
        s.host.stop(grace_s=0)


# ---------------------------------------------------------------------------------------------------
# concurrency
# ---------------------------------------------------------------------------------------------------
def test_two_concurrent_clients_equal_a_serial_order(served, transport):
    steps = {c: [make_step(100 * c + k, m=1 + k % 2) for k in range(5)] for c in (0, 1)}
    results: dict[int, list] = {0: [], 1: []}
    errors: list = []
    start = threading.Barrier(2)

    def run(cluster: int) -> None:
        try:
            with served.client(cluster) as client:
                start.wait(timeout=10)
                for z, mbs in steps[cluster]:
                    results[cluster].append(client(z, mbs))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(c,)) for c in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    order = served.host.served_order
    assert sorted(c for _, c, _ in order) == [0] * 5 + [1] * 5
    # replay the host's serial order in process, from the initial state
    next_index = {0: 0, 1: 0}
    for _, cluster, seq in order:
        k = next_index[cluster]
        assert seq == k + 1  # each stream is served in its own order
        next_index[cluster] += 1
        z, mbs = steps[cluster][k]
        ref_loss, ref_grads = head_step(served.ref_head, served.ref_optimizer, z, mbs)
        loss, grads = results[cluster][k]
        assert abs(loss - ref_loss) <= 1e-6
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, atol=1e-6, rtol=0)
    assert_same_state(snapshot(served.head, served.optimizer), snapshot(served.ref_head, served.ref_optimizer))


# ---------------------------------------------------------------------------------------------------
# with the real pipeline and model
# ---------------------------------------------------------------------------------------------------
def test_pipeline_with_remote_decoder_equals_local_decoder(transport):
    """ClusterPipeline + the translation Transformer: the decoder behind the data plane gives the same
    losses, encoder and decoder weights as the in-process LocalHead (same numbers, no tolerance)."""
    from collapipe_flwr.models.transformer import TransformerConfig, build_transformer
    from collapipe_flwr.pipeline.cluster import ClusterPipeline
    from collapipe_flwr.pipeline.head import LocalHead
    from collapipe_flwr.pipeline.optim import OptimizerSpec

    torch.manual_seed(0)
    remote_model = build_transformer(TransformerConfig(50, 60, 32, 4, 64, 2, 2, 0.0, 40, 0))
    local_model = copy.deepcopy(remote_model)
    spec = OptimizerSpec("adam", 1e-3)
    remote_pipe = ClusterPipeline(remote_model.embedding, remote_model.blocks, (1, 1), spec)
    local_pipe = ClusterPipeline(local_model.embedding, local_model.blocks, (1, 1), spec)
    host = DecoderHost(
        remote_model.head,
        spec.build(remote_model.head.parameters()),
        SECRET,
        DecoderHostSpec(hidden_size=32, bind="127.0.0.1", transport=transport),
    )
    host.start()
    host.open_round(1, [0])
    local = LocalHead(local_model.head, spec)
    g = torch.Generator().manual_seed(1)
    try:
        spec = DecoderClientSpec(transport=transport)
        with DecoderClient(host.address, cluster_key(SECRET, 1, 0), 1, 0, spec) as remote:
            for _ in range(3):
                mask = torch.ones(6, 9, dtype=torch.long)
                mask[:, -2:] = 0
                labels = torch.randint(3, 60, (6, 8), generator=g)
                labels[:, -1] = -100
                batch = {
                    "input_ids": torch.randint(3, 50, (6, 9), generator=g) * mask,
                    "attention_mask": mask,
                    "decoder_input_ids": torch.randint(3, 60, (6, 8), generator=g),
                    "labels": labels,
                }
                assert remote_pipe.train_step(batch, 2, remote).loss == local_pipe.train_step(batch, 2, local).loss
        enc_remote, enc_local = remote_pipe.encoder_state_dict(), local_pipe.encoder_state_dict()
        for k in enc_local:
            assert torch.equal(enc_remote[k], enc_local[k]), k
        for p, q in zip(remote_model.head.parameters(), local_model.head.parameters()):
            assert torch.equal(p, q)
    finally:
        remote_pipe.shutdown()
        local_pipe.shutdown()
        host.stop(grace_s=0)
