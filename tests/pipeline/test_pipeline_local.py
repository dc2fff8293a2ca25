"""ClusterPipeline on the in-process backend: schedule, repartition, state, memory accounting, errors."""

from __future__ import annotations

import ast
import copy
import inspect
from dataclasses import FrozenInstanceError

import pytest
import torch
from torch.nn import functional as F

from collapipe_flwr.errors import ConfigError, PartitionError, StateMismatchError
from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.models.transformer import TransformerConfig, build_transformer
from collapipe_flwr.pipeline import cluster, cluster_profile, cluster_step, placement
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.memory import (
    SavedTensorMeter,
    activation_bytes_per_token,
    block_param_count,
    max_blocks_per_device,
)
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.schedule import backward_cycles, forward_cycles
from collapipe_flwr.pipeline.stage import emulation_slowdowns
from collapipe_flwr.system.devices import DeviceProfile
from tests.pipeline.test_transparency import make_batch, make_model
from tests.plain_reference import plain_steps
from tests.runtimes import runtime

ADAM = OptimizerSpec(name="adam", lr=1e-2)


@pytest.mark.parametrize("m,S", [(1, 1), (4, 1), (1, 3), (4, 3), (2, 5)])
def test_gpipe_clock_cycles(m, S):
    fwd = forward_cycles(m, S)
    assert len(fwd) == S + m - 1
    seen = [task for cycle in fwd for task in cycle]
    assert sorted(seen) == sorted((i, k) for i in range(m) for k in range(S))
    when = {task: t for t, cycle in enumerate(fwd) for task in cycle}
    for (i, k), t in when.items():
        assert t == i + k  # stage k works on i while stage k+1 works on i-1
        if k:
            assert when[(i, k - 1)] < t
    bwd = backward_cycles(m, S)
    bwhen = {task: t for t, cycle in enumerate(bwd) for task in cycle}
    assert bwd[0] == [(m - 1, S - 1)]
    for (i, k), t in bwhen.items():
        if k < S - 1:
            assert bwhen[(i, k + 1)] < t
        if i < m - 1:
            assert bwhen[(i + 1, k)] < t


def test_repartition_carries_weights_and_optimizer_state():
    model, batch = make_model("bert"), make_batch("bert")
    batch2 = {k: v.flip(0) for k, v in batch.items()}
    ref, ref_losses = plain_steps(model, [batch, batch2, batch], ADAM)

    work = copy.deepcopy(model)
    head = LocalHead(work.head, ADAM)
    pipe = ClusterPipeline(work.embedding, work.blocks, (1, 3, 2), ADAM)
    losses = [pipe.train_step(batch, 2, head).loss]
    with pytest.raises(PartitionError, match="remove 1 block"):
        pipe.placement.repartition((4, 1, 2))
    assert pipe.placement.delta == (1, 3, 2)  # unchanged, still usable
    pipe.placement.repartition((4, 0, 2))
    assert pipe.placement.delta == (4, 0, 2) and pipe.placement.S == 2
    losses.append(pipe.train_step(batch2, 4, head).loss)
    pipe.placement.repartition((6,))
    losses.append(pipe.train_step(batch, 1, head).loss)
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    got = pipe.encoder_state_dict()
    for name, w in ref.blocks.state_dict().items():
        torch.testing.assert_close(got[name], w, rtol=1e-7, atol=1e-10)
    pipe.shutdown()


def test_a_batch_shorter_than_m_is_still_the_plain_models_step():
    """m is the plan's count for a full batch; an epoch's short last batch (here 2 samples, m = 4) runs in one-sample
    micro-batches (torchgpipe's scatter), and both steps equal the plain model's (no CU round lost to it)."""
    model, batch = make_model("transformer"), make_batch("transformer")
    short = {k: v[:2] for k, v in batch.items()}
    ref, ref_losses = plain_steps(model, [batch, short], ADAM)
    work = copy.deepcopy(model)
    with ClusterPipeline(work.embedding, work.blocks, (2, 4), ADAM) as pipe:
        head = LocalHead(work.head, ADAM)
        losses = [pipe.train_step(b, 4, head).loss for b in (batch, short)]
        got = pipe.encoder_state_dict()
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    for name, w in ref.blocks.state_dict().items():
        torch.testing.assert_close(got[name], w, rtol=1e-7, atol=1e-10)


def test_blocks_are_copied_and_state_dicts_round_trip():
    model = make_model("transformer")
    original = copy.deepcopy(model.blocks.state_dict())
    pipe = ClusterPipeline(model.embedding, model.blocks, (2, 4), ADAM)
    pipe.train_step(make_batch("transformer"), 2, LocalHead(model.head, ADAM))
    for k, v in model.blocks.state_dict().items():  # caller's blocks untouched
        assert torch.equal(v, original[k])
    trained = pipe.encoder_state_dict()
    assert list(trained) == list(original)
    assert any(not torch.equal(trained[k], original[k]) for k in trained)
    pipe.load_encoder_state_dict(original)
    for k, v in pipe.encoder_state_dict().items():
        assert torch.equal(v, original[k])
    with pytest.raises(StateMismatchError, match=r"lacks 5\.layer\..* \(\d+ missing, 0 unexpected\).*L=6"):
        pipe.load_encoder_state_dict({k: v for k, v in original.items() if not k.startswith("5.")})
    with pytest.raises(StateMismatchError, match="embedding state dict does not fit"):
        pipe.load_embedding_state_dict({"tokens.weight": torch.zeros(3, 3)})
    emb = pipe.embedding_state_dict()
    pipe.load_embedding_state_dict({k: torch.zeros_like(v) for k, v in emb.items()})
    assert all(float(v.abs().sum()) == 0 for v in pipe.embedding_state_dict().values())


def test_saved_tensor_meter_counts_by_hand():
    x = torch.randn(5, 3)
    w = torch.randn(4, 3, requires_grad=True)
    with SavedTensorMeter(exclude=[w]) as meter:
        y = F.linear(x, w)  # saves x (w excluded): 5*3*4 bytes
        z = torch.relu(y)  # saves its result: 5*4*4 bytes
        z.sum().backward()
    assert meter.bytes == 5 * 3 * 4 + 5 * 4 * 4
    with SavedTensorMeter() as meter2:
        v = torch.randn(6, 2, requires_grad=True)
        (v * v).sum()  # v saved twice, one storage
    assert meter2.bytes == 6 * 2 * 4


def test_memory_report_counts_params_optimizer_state_and_gpipe_activations():
    model, batch = make_model("bert"), make_batch("bert")
    reports = {}
    for delta, m in (((6,), 1), ((6,), 4), ((3, 3), 2)):
        work = copy.deepcopy(model)
        with ClusterPipeline(work.embedding, work.blocks, delta, ADAM) as pipe:
            pipe.train_step(batch, m, LocalHead(work.head, ADAM))
            reports[(delta, m)] = pipe.memory_report()
    (whole,) = reports[((6,), 1)]
    n_params = sum(p.numel() for p in model.blocks.parameters())
    n_tensors = len(list(model.blocks.parameters()))
    assert whole["param_bytes"] == n_params * 8  # float64
    # Adam: exp_avg + exp_avg_sq per element plus one scalar `step` per tensor
    assert 2 * n_params * 8 <= whole["optimizer_bytes"] <= 2 * n_params * 8 + 8 * n_tensors
    assert whole["peak_bytes"] == whole["param_bytes"] + whole["optimizer_bytes"] + whole["peak_activation_bytes"]
    # GPipe keeps all m micro-batches until backward: the peak does not shrink with m ...
    (whole_m4,) = reports[((6,), 4)]
    assert whole_m4["peak_activation_bytes"] == pytest.approx(whole["peak_activation_bytes"], rel=0.1)
    # ... and two half segments each hold about half of it
    halves = reports[((3, 3), 2)]
    assert [r["device"] for r in halves] == [0, 1]
    assert sum(r["param_bytes"] for r in halves) == whole["param_bytes"]
    for r in halves:
        assert r["peak_activation_bytes"] == pytest.approx(whole["peak_activation_bytes"] / 2, rel=0.1)


@pytest.mark.parametrize("family", ["bert", "transformer"])
@pytest.mark.parametrize("H,F_,h,T", [(16, 32, 2, 8), (64, 256, 4, 32), (128, 512, 4, 64)])
def test_activation_estimate_is_an_upper_bound_within_3x(family, H, F_, h, T):
    torch.manual_seed(0)
    if family == "bert":
        block = build_bert(BertSplitConfig(50, H, h, F_, 1, 0.0, 128, "token", 3)).blocks[0]
    else:
        block = build_transformer(TransformerConfig(50, 50, H, h, F_, 1, 1, 0.0, 128, 0)).blocks[0]
    assert sum(p.numel() for p in block.parameters()) == block_param_count(H, F_)
    x = torch.randn(3, T, H, requires_grad=True)
    mask = torch.ones(3, T, dtype=torch.long)
    mask[0, T // 2 :] = 0
    with SavedTensorMeter(exclude=block.parameters()) as meter:
        block(x, mask)
    estimate = activation_bytes_per_token(H, F_, h, T) * 3 * T
    assert meter.bytes <= estimate <= 3 * meter.bytes


def test_memory_budget_rejects_too_many_blocks():
    model, batch = make_model("bert"), make_batch("bert")
    per_block_static = sum(p.numel() for p in model.blocks[0].parameters()) * 8 * 3  # float64, params + Adam
    big = DeviceProfile(f_hz=1e9, flops_per_cycle=4, memory_bytes=1e12, d2d_power_w=0.1)
    small = DeviceProfile(f_hz=1e9, flops_per_cycle=4, memory_bytes=2.5 * per_block_static, d2d_power_w=0.1)
    with pytest.raises(PartitionError, match="device 1 can hold at most 2 block"):
        ClusterPipeline(model.embedding, model.blocks, (1, 3, 2), ADAM, devices=[big, small, big])
    with pytest.raises(PartitionError, match="K=2 device profiles"):
        ClusterPipeline(model.embedding, model.blocks, (1, 3, 2), ADAM, devices=[big, big])
    # fits statically (2 blocks) but not with the batch's activations
    tight = DeviceProfile(f_hz=1e9, flops_per_cycle=4, memory_bytes=2.05 * per_block_static, d2d_power_w=0.1)
    pipe = ClusterPipeline(model.embedding, model.blocks, (2, 2, 2), ADAM, devices=[tight, big, big])
    with pytest.raises(PartitionError, match=r"device 0 can hold at most 1 block\(s\) for a batch of 4x7 tokens"):
        pipe.train_step(batch, 2, LocalHead(model.head, ADAM))
    assert max_blocks_per_device([10.0, 25.0], 10.0) == [1, 2]


def test_emulation_slowdowns_are_relative_throughputs():
    fast = DeviceProfile(f_hz=2e9, flops_per_cycle=8, memory_bytes=1e9, d2d_power_w=0.1)
    slow = DeviceProfile(f_hz=1e9, flops_per_cycle=4, memory_bytes=1e9, d2d_power_w=0.1)
    assert emulation_slowdowns([fast, slow, slow], [0, 1]) == {0: 1.0, 1: 4.0}
    assert emulation_slowdowns([fast, slow, slow], [1, 2]) == {1: 1.0, 2: 1.0}
    with pytest.raises(ConfigError, match="emulate=true needs device profiles"):
        model = make_model("bert")
        ClusterPipeline(model.embedding, model.blocks, (6,), ADAM, runtime=runtime(emulate=True))


def test_emulated_slow_device_takes_longer():
    model, batch = make_model("bert"), make_batch("bert")
    fast = DeviceProfile(f_hz=40e9, flops_per_cycle=8, memory_bytes=1e12, d2d_power_w=0.1)
    slow = DeviceProfile(f_hz=1e9, flops_per_cycle=8, memory_bytes=1e12, d2d_power_w=0.1)
    with ClusterPipeline(
        model.embedding, model.blocks, (3, 3), ADAM, devices=[fast, slow], runtime=runtime(emulate=True)
    ) as pipe:
        result = pipe.train_step(batch, 2, LocalHead(model.head, ADAM))
    compute = result.timings.device_compute
    # same work, 40x slower device: a wide margin so a busy machine cannot flip it
    assert compute[1] > 8 * compute[0]


def test_step_result_and_bad_arguments():
    model, batch = make_model("transformer"), make_batch("transformer")
    with ClusterPipeline(model.embedding, model.blocks, (2, 4), ADAM) as pipe:
        result = pipe.train_step(batch, 2, LocalHead(model.head, ADAM))
        assert result.count == int((batch["labels"] != -100).sum())
        phases = result.timings.phases()
        assert list(phases) == ["embed", "forward", "head", "backward", "update", "total"]
        assert all(v >= 0.0 for v in phases.values()) and phases["embed"] <= phases["forward"] <= phases["total"]
        assert set(result.timings.device_compute) == {0, 1}
        # stages in the CU's own process (local backend): that process's CPU is the CU's, so none is reported
        assert result.timings.device_cpu == {0: 0.0, 1: 0.0}
        with pytest.raises(FrozenInstanceError):
            result.timings.total = 0.0  # type: ignore[misc]
        with pytest.raises(ConfigError, match="m=0 micro-batches: choose m >= 1"):
            pipe.train_step(batch, 0, LocalHead(model.head, ADAM))
        with pytest.raises(ValueError, match="1 gradients for 2 micro-batches"):
            pipe.train_step(batch, 2, lambda z, mbs, lr: (0.0, [torch.zeros_like(z[0])]))
        # a failed step leaves nothing behind: the next one still works
        pipe.train_step(batch, 2, LocalHead(model.head, ADAM))
    with pytest.raises(ConfigError, match="backend"):
        runtime(backend="mpi")
    with pytest.raises(PartitionError, match="add 1 block"):
        ClusterPipeline(model.embedding, model.blocks, (2, 3), ADAM)


@pytest.mark.parametrize("module", [cluster, cluster_profile, cluster_step, placement])
def test_the_driver_never_touches_ray(module):
    """The driver (pipeline/cluster.py and its parts) is backend-neutral: no Ray import, no ``ray.*`` call, even
    inside a function."""
    tree = ast.parse(inspect.getsource(module))
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "ray" not in imported
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "ray" not in names and "_ray" not in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
