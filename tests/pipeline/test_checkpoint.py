"""pipeline.checkpoint: GPipe's re-materialization (never | except_last | always) on the stages.

(1) the same gradients and weights as without it, bit for bit (dropout on, seeded or not, GPipe and 1F1B), and
as the plain model seeded the way pipeline/dropout_seed.py says; (2) the stages' measured peak activation bytes
fall by the factor the shapes give, the recompute's transient activations counted; (3) the memory model
(``held_activation_samples``, ``memory.segment_memory_bytes``, ``Workload``, ``ClusterModel``) by hand and
against a measured step; (4) the option is a validated config choice that reaches the stages.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from collapipe_flwr.config import build_run_config, load_run_config
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.errors import ConfigError, PartitionError
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.dropout_seed import EMBEDDING, block_seed, step_seed
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.memory import SavedTensorMeter, segment_memory_bytes
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME
from collapipe_flwr.pipeline.stage import Stage, StageCompute
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.pipeline_model import checkpoint_stop, held_activation_samples
from collapipe_flwr.system.workload import Workload
from tests.pipeline.test_pipeline_1f1b import batch as ragged_batch
from tests.pipeline.test_pipeline_1f1b import bert
from tests.pipeline.test_seeded_dropout import make_model
from tests.runtimes import runtime
from tests.workloads import uniform_workload

MODES = ("never", "except_last", "always")
ADAM = OptimizerSpec(name="adam", lr=1e-2)
S_DELTA, M, B, T = (2, 2), 4, 8, 6
STEPS = 3


def seeded_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(1, 29, (B, T), generator=g)
        mask = torch.ones(B, T, dtype=torch.long)
        mask[1, T - 2 :] = 0
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 5, (B, T), generator=g)})
    return out


def seed_of(j: int) -> int:
    return step_seed(11, round_=1, cluster=0, step=j)


def run(model, batches, checkpoint: str, schedule: str = "gpipe", seeded: bool = True, backend: str = "local"):
    """STEPS steps of the split model (S = 2, m = 4, Adam) with ``checkpoint``; (encoder, embedding, head, losses,
    the stages' memory reports). Unseeded: torch's generator set to the same state before each step."""
    work = copy.deepcopy(model)
    rt = dataclasses.replace(runtime(backend=backend), checkpoint=checkpoint, schedule=schedule)
    losses = []
    with ClusterPipeline(work.embedding, work.blocks, S_DELTA, ADAM, runtime=rt) as pipe:
        head = LocalHead(work.head, ADAM)
        for j, data in enumerate(batches):
            if not seeded:
                torch.manual_seed(100 + j)
            losses.append(pipe.train_step(data, M, head, step_seed=seed_of(j) if seeded else None).loss)
        encoder, reports = pipe.encoder_state_dict(), pipe.memory_report()
    return encoder, work.embedding.state_dict(), work.head.state_dict(), losses, reports


def plain_seeded(model, batches) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The un-split model, one Adam per part, torch seeded before the embedding and each block l of micro-batch i
    (equal rows, as the pipeline splits them) with block_seed(step seed, i, l); loss = sum / count."""
    model = copy.deepcopy(model).train()
    opts = [ADAM.build(p.parameters()) for p in model.parts()]
    losses = []
    for j, data in enumerate(batches):
        for o in opts:
            o.zero_grad()
        total, count = 0.0, 0
        for i, rows in enumerate(torch.arange(B).tensor_split(M)):
            mb = {k: v[rows] for k, v in data.items()}
            torch.manual_seed(block_seed(seed_of(j), i, EMBEDDING))
            hidden = model.embedding(mb["input_ids"])
            for l, block in enumerate(model.blocks):
                torch.manual_seed(block_seed(seed_of(j), i, l))
                hidden = block(hidden, mb["attention_mask"])
            s, c = model.head.loss_terms(hidden, mb["attention_mask"], mb)
            total, count = total + s, count + int(c)
        (total / count).backward()
        for o in opts:
            o.step()
        losses.append(float((total / count).detach()))
    return {**{f"blocks.{k}": v for k, v in model.blocks.state_dict().items()}}, losses


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


# -- (1) the same numbers, bit for bit --------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_checkpointed_steps_equal_the_kept_ones_bit_for_bit_and_the_plain_model(schedule):
    """Dropout 0.4 with seeded masks: every mode gives the never run's weights exactly (the recompute runs the
    forward's kernels in grad mode on the same leaf with the same masks, and the stages add the micro-batches'
    gradients in the same order), and the never run equals the plain model as test_seeded_dropout compares."""
    model, batches = make_model(), seeded_batches()
    never = run(model, batches, "never", schedule)
    for mode in ("except_last", "always"):
        other = run(model, batches, mode, schedule)
        for kept, got in zip(never[:3], other[:3]):
            assert_identical(kept, got)
        assert other[3] == never[3]
    ref, ref_losses = plain_seeded(model, batches)
    assert never[3] == pytest.approx(ref_losses, rel=1e-10)
    for name, w in ref.items():
        torch.testing.assert_close(never[0][name.removeprefix("blocks.")], w, rtol=1e-5, atol=1e-10)
    assert any(not torch.equal(never[0][k], v) for k, v in model.blocks.state_dict().items())  # it trained


def test_unseeded_dropout_recomputes_the_forwards_masks_and_leaves_the_generator_alone():
    """Without runtime.seeded_dropout the masks come from the process's generator: the recompute replays the state
    its forward started from, so the step is the never run's, and after it the generator is where never leaves it."""
    model, batches = make_model(), seeded_batches()[:2]
    never, after_never = run(model, batches, "never", seeded=False), torch.rand(4)
    always, after_always = run(model, batches, "always", seeded=False), torch.rand(4)
    for kept, got in zip(never[:3], always[:3]):
        assert_identical(kept, got)
    assert torch.equal(after_never, after_always)


@pytest.mark.e2e
def test_ray_device_actors_re_materialize_with_the_same_numbers(ray_session):
    model, batches = make_model(), seeded_batches()[:2]
    local, ray_run = run(model, batches, "never"), run(model, batches, "always", backend="ray")
    for kept, got in zip(local[:3], ray_run[:3]):
        assert_identical(kept, got)
    assert ray_run[4][0]["peak_activation_bytes"] < local[4][0]["peak_activation_bytes"]


# -- (2) the measured peak activation bytes -----------------------------------------------------------------------
def peaks(checkpoint: str, model, data, m: int, delta=(3, 3)) -> list[int]:
    work = copy.deepcopy(model)
    rt = dataclasses.replace(LOCAL_RUNTIME, checkpoint=checkpoint)
    with ClusterPipeline(work.embedding, work.blocks, delta, ADAM, runtime=rt) as pipe:
        pipe.train_step(data, m, LocalHead(work.head, ADAM))
        return [r["peak_activation_bytes"] for r in pipe.memory_report()]


def test_peak_activation_bytes_fall_to_the_inputs_plus_one_recomputed_micro_batch():
    """S = 2 (3 blocks each), m = 8 equal micro-batches of b_hat = 4 samples, T = 16, H = 32, fp32. never: 8
    micro-batches x 3 blocks of saved tensors. always: the 8 segment inputs (4 x 16 x 32 x 4 bytes each) plus ONE
    micro-batch's 3 blocks while it is recomputed, i.e. at most 8 x input + never / 8 (the recomputed one's input
    counted twice there): with a BERT block saving far more than its input that is < never / 3. The recompute must
    count: without it the peak would be the 8 inputs alone, < never / 8."""
    m, b_hat, H, T_ = 8, 4, 32, 16
    model, data = bert(hidden=H, dtype=torch.float32), ragged_batch(4, B=m * b_hat, T=T_)
    data["attention_mask"][:] = 1
    one_input = b_hat * T_ * H * 4
    never, always, except_last = (peaks(mode, model, data, m) for mode in MODES)
    for k in range(2):
        assert always[k] <= m * one_input + never[k] / m + 1024, (k, never, always)
        assert always[k] >= never[k] / m and always[k] >= m * one_input  # the recompute and the inputs both count
        assert always[k] < never[k] / 3
        # except_last: 7 inputs and the last micro-batch's activations, its backward first, then 6 inputs + 1
        assert except_last[k] <= (m - 1) * one_input + never[k] / m + 1024
        assert except_last[k] >= never[k] / m


class LiveTensorBytes(TorchDispatchMode):
    """The truth the meter is checked against: every storage an op creates inside counts from its creation until
    it is freed (a weak reference's callback), so ``peak`` is the most tensor memory alive at once, temporaries
    (backward's activation gradients) and parameter gradients included."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, weakref.ref] = {}
        self.now = self.peak = 0

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size and key not in self.live:
            self.now += size
            self.peak = max(self.peak, self.now)
            self.live[key] = weakref.ref(storage, lambda _ref, key=key, size=size: self._free(key, size))

    def _free(self, key: int, size: int) -> None:
        if self.live.pop(key, None) is not None:
            self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._track, out)
        return out


def test_the_meters_peak_is_the_live_tensor_peak_with_the_recompute_in_it():
    """One stage of 3 blocks, m = 8 forwards then 8 backwards: the meter's peak (what memory_report and
    results/pretrained_lora.py's device_peaks read) never exceeds the live tensor bytes less the parameter
    gradients, and misses only the backward's temporaries, less than one micro-batch's saved activations."""
    model, m = bert(hidden=32, dtype=torch.float32), 8
    g = torch.Generator().manual_seed(0)
    xs, grads = ([torch.randn(4, 16, 32, generator=g) for _ in range(m)] for _ in range(2))
    mask = torch.ones(4, 16, dtype=torch.long)
    measured = {}
    for mode in MODES:
        segment = copy.deepcopy(model.blocks[:3])
        stage = Stage(0, segment, OptimizerSpec(name="sgd", lr=0.1), compute=StageCompute(checkpoint=mode))
        stage.begin_step(None, m)
        with LiveTensorBytes() as live:
            for i in range(m):
                stage.forward(i, xs[i], mask)
            for i in reversed(range(m)):
                stage.backward(i, grads[i])
        param_grads = sum(p.numel() * p.element_size() for p in segment.parameters())
        measured[mode] = (stage.peak_activation_bytes, live.peak - param_grads)
    one_micro_batch = measured["never"][0] / m
    for mode, (meter, truth) in measured.items():
        assert meter <= truth <= meter + one_micro_batch, (mode, measured)
    assert measured["always"][1] < measured["never"][1] / 3


# -- (3) the memory model ----------------------------------------------------------------------------------------
def test_held_activation_samples_and_the_checkpoint_stop_by_hand():
    assert [checkpoint_stop(mode, 4) for mode in MODES] == [0, 3, 4]
    assert checkpoint_stop("except_last", 1) == 0
    # b = 20, m = 8: b_hat = 3; GPipe holds all 20 samples; S = 3, 1F1B stage 0 holds 3 micro-batches = 9 samples
    assert held_activation_samples("gpipe", "never", 20, 8, 3, 0) == (20, 0)
    assert held_activation_samples("gpipe", "always", 20, 8, 3, 0) == (3, 17)
    assert held_activation_samples("gpipe", "except_last", 20, 8, 3, 0) == (3, 17)
    assert held_activation_samples("1f1b", "always", 20, 8, 3, 0) == (3, 6)
    assert held_activation_samples("1f1b", "except_last", 20, 8, 3, 0) == (6, 3)  # the last one still held
    assert held_activation_samples("1f1b", "except_last", 20, 8, 3, 2) == (3, 0)  # the last stage holds one
    assert held_activation_samples("gpipe", "except_last", 20, 1, 3, 0) == (20, 0)  # m = 1: nothing checkpointed
    with pytest.raises(ValueError, match="checkpoint 'sometimes' must be one of never, except_last, always"):
        held_activation_samples("gpipe", "sometimes", 20, 8, 3, 0)


def test_workload_and_dssra_caps_follow_the_checkpoint_by_hand():
    """uniform_workload: static 1000 x (2 + 2) = 4000 bytes a block, 50 saved bytes a sample, b = 20, z^s of 10
    bytes a sample (boundary); m = 4 (b_hat = 5), GPipe."""
    never = uniform_workload(4, 1e6, 10.0, 1000.0, 50.0, 20)
    always = dataclasses.replace(never, checkpoint="always")
    assert never.stage_memory_bytes(2, 4, 2, 0) == 2 * (4000 + 50 * 20)
    assert always.stage_memory_bytes(2, 4, 2, 0) == 2 * (4000 + 50 * 5) + 10 * 15
    assert always.block_memory_bytes() == never.block_memory_bytes()  # m unknown: the whole batch, a bound
    assert "checkpoint" not in never.to_dict() and Workload.from_dict(always.to_dict()) == always
    K, memory = 3, 9_000.0  # never: gamma_0 = 5000 -> 1 block; always: (9000 - 150) / 4250 -> 2 blocks
    model = ClusterModel(
        cluster=0, num_blocks=4, batch_size=20, steps=1, flops_per_sample_block=3e6, activation_bits=1e4,
        flops_per_second=np.full(K, 1e9), flops_per_cycle=np.full(K, 1.0), f_hz=np.full(K, 1e9),
        d2d_rate=np.full(K, 1e8), d2d_power=np.full(K, 0.1), memory_cap=np.full(K, 1), energy_max=1e9,
        kappa=1e-28, memory_bytes=np.full(K, memory), block_static_bytes=4000.0, saved_bytes_per_sample=50.0,
        input_bytes_per_sample=10.0,
    )  # fmt: skip
    assert list(model.block_cap(4)) == [1, 1, 1]
    ck = dataclasses.replace(model, checkpoint="always")
    assert list(ck.block_cap(4)) == [2, 2, 2]
    assert ck.block_cap(np.array([1, 4])).tolist() == [[1, 1, 1], [2, 2, 2]]  # m = 1: the whole batch in full
    assert list(ck.stage_memory_cap((2, 2, 0), 4)) == [2, 2, 1]
    for S, k in ((2, 0), (3, 1)):  # the same bound as the workload's C7 left side
        cap = int(ck.memory_cap_at(4, S, k)[0])
        assert always.stage_memory_bytes(cap, 4, S, k) <= memory < always.stage_memory_bytes(cap + 1, 4, S, k)


def test_segment_estimate_bounds_the_measured_checkpointed_peak():
    """memory.segment_memory_bytes at held_activation_samples' (full, inputs) against a measured step (the stage's
    params + Adam state + peak activation bytes), as test_pipeline_local bounds block_memory_bytes: an upper bound
    within 3x, for never and always."""
    m, b_hat, T_ = 4, 4, 16
    model, data = bert(hidden=32, dtype=torch.float32), ragged_batch(5, B=m * b_hat, T=T_)
    data["attention_mask"][:] = 1
    for mode in ("never", "always"):
        work = copy.deepcopy(model)
        with ClusterPipeline(
            work.embedding, work.blocks, (3, 3), ADAM, runtime=dataclasses.replace(LOCAL_RUNTIME, checkpoint=mode)
        ) as pipe:
            pipe.train_step(data, m, LocalHead(work.head, ADAM))
            reports = pipe.memory_report()
        for k, report in enumerate(reports):
            full, inputs = held_activation_samples("gpipe", mode, m * b_hat, m, 2, k)
            estimate = segment_memory_bytes(model.blocks[0], 3, full, inputs, T_, "adam")
            assert report["peak_bytes"] <= estimate <= 3 * report["peak_bytes"], (mode, k, report, estimate)


def test_the_cus_c7_check_lets_a_re_materializing_stage_hold_more_blocks():
    """ClusterPlacement.check_memory: two devices whose budget is exactly 3 blocks under always (m = 4, b = 16:
    4 samples in full, 12 as inputs) train (3, 3) with it, and refuse it without (3 blocks at all 16 samples)."""
    model, data = bert(), ragged_batch(6)
    block, T_ = model.blocks[0], data["input_ids"].shape[1]
    budget = segment_memory_bytes(block, 3, *held_activation_samples("gpipe", "always", 16, 4, 2, 0), T_, "adam")
    assert segment_memory_bytes(block, 3, 16, 0, T_, "adam") > budget
    device = DeviceProfile(f_hz=1e9, flops_per_cycle=4, memory_bytes=budget, d2d_power_w=0.1)
    for mode in ("never", "always"):
        work = copy.deepcopy(model)
        rt = dataclasses.replace(LOCAL_RUNTIME, checkpoint=mode)
        with ClusterPipeline(work.embedding, work.blocks, (3, 3), ADAM, devices=[device, device], runtime=rt) as pipe:
            if mode == "never":
                with pytest.raises(PartitionError, match=r"device 0 can hold at most 1 block\(s\) .* gpipe \("):
                    pipe.train_step(data, 4, LocalHead(work.head, ADAM))
            else:
                pipe.train_step(data, 4, LocalHead(work.head, ADAM))


def test_the_meter_counts_a_held_tensor_once():
    x = torch.randn(4, 3)
    with SavedTensorMeter() as meter:
        meter.count(x)
        meter.count(x[1:])  # a view of the same storage
    assert meter.bytes == 4 * 3 * 4


# -- (4) the config option -----------------------------------------------------------------------------------------
def test_checkpoint_is_a_validated_config_choice_that_reaches_the_stages(data_dir):
    cfg = load_run_config(["federation=tiny"], data_dir=str(data_dir))
    assert cfg.pipeline.checkpoint == "never" and "checkpoint" not in cfg.to_dict()["pipeline"]
    cfg = load_run_config(["federation=tiny", "pipeline.checkpoint=always"], data_dir=str(data_dir))
    assert cfg.pipeline.checkpoint == "always" and cfg.cluster_config().pipeline.checkpoint == "always"
    assert build_run_config(cfg.to_dict()) == cfg
    with pytest.raises(
        ConfigError, match=r"^pipeline\.checkpoint='sometimes' must be one of never, except_last, always$"
    ):
        load_run_config(["federation=tiny", "pipeline.checkpoint=sometimes"], data_dir=str(data_dir))
    model = bert()
    rt = dataclasses.replace(LOCAL_RUNTIME, checkpoint="except_last")
    with ClusterPipeline(model.embedding, model.blocks, (3, 3), ADAM, runtime=rt) as pipe:
        assert all(stage.checkpoint == "except_last" for stage in pipe.placement.stages.stages)
        with pytest.raises(ValueError, match="except_last needs the step's m"):
            pipe.placement.stages.stages[0].begin_step(None)
    with pytest.raises(ConfigError, match=r"pipeline\.checkpoint='x' must be one of"):
        dataclasses.replace(LOCAL_RUNTIME, checkpoint="x")
