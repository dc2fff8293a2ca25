"""pipeline.schedule: 1f1b: one head exchange per micro-batch, stages in 1F1B order.

Against independent references: the plain (un-split) model trained in one process, GPipe on the same stages,
the stage orders written out by hand, the C7 term by hand, and the real data plane (the server's decoder)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from collapipe_flwr.config import build_run_config, load_run_config
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.segments import fixed_segments
from collapipe_flwr.errors import ConfigError, InfeasiblePlanError
from collapipe_flwr.fl.messages import unpack_weights
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME
from collapipe_flwr.pipeline.schedule import one_f_one_b_order
from collapipe_flwr.system.pipeline_model import held_micro_batches, held_samples
from collapipe_flwr.system.workload import Workload
from tests.plain_reference import plain_steps
from tests.tiny_models import tiny_bert, tiny_transformer, translation_batch
from tests.workloads import uniform_workload

ADAM = OptimizerSpec(name="adam", lr=1e-2)
SGD_ONE = OptimizerSpec(name="sgd", lr=1.0)  # one step: parameters before - after = the gradient
L = 6
# (S, first delta, the delta after the re-partition) on K = 3 devices
PARTITIONS = {2: ((3, 3, 0), (2, 0, 4)), 3: ((2, 2, 2), (1, 3, 2))}


def bert(hidden: int = 16, dtype=torch.float64):
    model = tiny_bert(29, hidden, 2 * hidden, L, 5)
    for part in model.parts():
        part.to(dtype)
    return model


def batch(seed: int, B: int = 16, T: int = 9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    labels = torch.randint(0, 5, (B, T), generator=g).masked_fill(mask == 0, -100)
    labels[:, 0] = -100
    return {"input_ids": torch.randint(1, 29, (B, T), generator=g) * mask, "attention_mask": mask, "labels": labels}


def pipeline_steps(model, batches, spec, schedule: str, S: int, m: int, runtime=LOCAL_RUNTIME, traces=None):
    """The split model on S stages in ``schedule``, re-partitioned between the steps; (embedding, encoder state,
    head, losses); each step's per-stage traces appended to ``traces`` when given."""
    work = copy.deepcopy(model)
    first, second = PARTITIONS[S]
    head = LocalHead(work.head, spec)
    rt = dataclasses.replace(runtime, schedule=schedule)
    with ClusterPipeline(work.embedding, work.blocks, first, spec, runtime=rt) as pipe:
        losses = []
        for step, data in enumerate(batches):
            if step == 1:
                pipe.placement.repartition(second)
                assert pipe.placement.S == S
            losses.append(pipe.train_step(data, m, head).loss)
            if traces is not None:
                traces.append(pipe.traces())
        encoder = pipe.encoder_state_dict()
    return work.embedding, encoder, work.head, losses


def assert_same_parts(embedding, encoder, head, ref, tol=1e-6):
    for name, w in ref.embedding.state_dict().items():
        torch.testing.assert_close(embedding.state_dict()[name], w, rtol=tol, atol=tol)
    for name, w in ref.blocks.state_dict().items():
        torch.testing.assert_close(encoder[name], w, rtol=tol, atol=tol)
    for name, w in ref.head.state_dict().items():
        torch.testing.assert_close(head.state_dict()[name], w, rtol=tol, atol=tol)


# -- (a) the same gradients and parameters as GPipe and the plain model -------------------------------------
@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("m", [4, 8])
def test_1f1b_parameters_after_two_steps_equal_gpipe_and_the_plain_model(S, m):
    model, batches = bert(), [batch(1), batch(2)]
    ref, ref_losses = plain_steps(model, batches, ADAM)
    *gpipe_parts, gpipe_losses = pipeline_steps(model, batches, ADAM, "gpipe", S, m)
    *parts, losses = pipeline_steps(model, batches, ADAM, "1f1b", S, m)
    assert losses == pytest.approx(gpipe_losses, rel=1e-10) and losses == pytest.approx(ref_losses, rel=1e-10)
    assert_same_parts(*parts, ref)
    assert_same_parts(*parts, ref_of(*gpipe_parts))


def ref_of(embedding, encoder, head):
    """GPipe's parts in the plain model's shape, for :func:`assert_same_parts`."""
    model = bert()
    model.embedding.load_state_dict(embedding.state_dict())
    model.blocks.load_state_dict(encoder)
    model.head.load_state_dict(head.state_dict())
    return model


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("m", [4, 8])
def test_1f1b_gradients_equal_gpipe_and_the_plain_model(S, m):
    """SGD at lr 1 for one step: each parameter moves by exactly its gradient, so before - after compares the
    gradients of the embedding, every TEB and the head."""
    model, data = bert(), [batch(3)]
    ref, _ = plain_steps(model, data, SGD_ONE)
    grads = {}
    for schedule in ("gpipe", "1f1b"):
        emb, enc, head, _ = pipeline_steps(model, data, SGD_ONE, schedule, S, m)
        grads[schedule] = gradients(model, ref_of(emb, enc, head))
    plain = gradients(model, ref)
    for name, g in plain.items():
        assert float(g.abs().max()) > 0 or name.endswith("bias")  # a real step: the check is not vacuous
        torch.testing.assert_close(grads["1f1b"][name], g, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(grads["1f1b"][name], grads["gpipe"][name], rtol=1e-6, atol=1e-9)


def gradients(before, after) -> dict[str, torch.Tensor]:
    """before - after per parameter, named by part (after one SGD step at lr 1: the step's gradient)."""
    out = {}
    for part, (x, y) in zip(("embedding", "blocks", "head"), zip(before.parts(), after.parts())):
        for (name, p), q in zip(x.named_parameters(), y.parameters()):
            out[f"{part}.{name}"] = p.detach() - q.detach()
    return out


# -- (b) per-stage peak activation memory -------------------------------------------------------------------
def test_1f1b_peak_activation_memory_per_stage_at_most_half_of_gpipes():
    """S = 2, m = 8: stage k holds min(m, S - k) micro-batches (2 and 1 of 8) instead of 8 (SavedTensorMeter
    bytes in each stage's memory report)."""
    model, data = bert(hidden=32, dtype=torch.float32), batch(4, B=32, T=16)
    data["attention_mask"][:] = 1  # equal micro-batches: the ratios are exact counts of micro-batches
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        work = copy.deepcopy(model)
        rt = dataclasses.replace(LOCAL_RUNTIME, schedule=schedule)
        with ClusterPipeline(work.embedding, work.blocks, (3, 3), ADAM, runtime=rt) as pipe:
            pipe.train_step(data, 8, LocalHead(work.head, ADAM))
            peaks[schedule] = [r["peak_activation_bytes"] for r in pipe.memory_report()]
    for k, (one, gp) in enumerate(zip(peaks["1f1b"], peaks["gpipe"])):
        assert one <= 0.5 * gp, (k, peaks)
        assert one == pytest.approx(gp * held_micro_batches("1f1b", 8, 2, k) / 8, rel=0.05)


def ops(text: str) -> list[tuple[str, int]]:
    """ "FFB..." -> [("F", 0), ("F", 1), ("B", 0), ...]: forwards and backwards each numbered in order."""
    seen = {"F": 0, "B": 0}
    out = []
    for kind in text:
        out.append((kind, seen[kind]))
        seen[kind] += 1
    return out


def test_stage_orders_are_1f1b_and_each_stage_runs_them_so():
    assert one_f_one_b_order(0, 3, 4) == ops("FFFBFBBB")  # 2 warm-up forwards, then 1F1B, then 2 cool-down
    assert one_f_one_b_order(1, 3, 4) == ops("FFBFBFBB")
    assert one_f_one_b_order(2, 3, 4) == ops("FBFBFBFB")
    assert one_f_one_b_order(0, 4, 2) == ops("FFBB")  # warm-up min(S - k - 1, m)
    model = bert()
    rt = dataclasses.replace(LOCAL_RUNTIME, schedule="1f1b")
    with ClusterPipeline(model.embedding, model.blocks, (2, 2, 2), ADAM, runtime=rt) as pipe:
        pipe.train_step(batch(5), 4, LocalHead(model.head, ADAM))
        traces = pipe.traces()
    for k, trace in enumerate(traces):
        assert [(kind, i) for kind, i, _, _ in trace] == one_f_one_b_order(k, 3, 4)


def test_1f1b_needs_a_head_with_one_exchange_per_micro_batch():
    model = bert()
    rt = dataclasses.replace(LOCAL_RUNTIME, schedule="1f1b")
    head = LocalHead(model.head, ADAM)
    with ClusterPipeline(model.embedding, model.blocks, (3, 3), ADAM, runtime=rt) as pipe:
        with pytest.raises(TypeError, match="one exchange per micro-batch"):
            pipe.train_step(batch(6), 2, lambda z, mbs, lr: head(z, mbs, lr))
    with pytest.raises(ConfigError, match=r"pipeline\.schedule='2f2b' must be one of gpipe, 1f1b"):
        ClusterPipeline(model.embedding, model.blocks, (3, 3), ADAM, runtime=dataclasses.replace(rt, schedule="2f2b"))


def test_schedule_is_a_validated_config_choice(data_dir):
    assert load_run_config(["federation=tiny"], data_dir=str(data_dir)).pipeline.schedule == "gpipe"
    cfg = load_run_config(["federation=tiny", "pipeline.schedule=1f1b"], data_dir=str(data_dir))
    assert cfg.pipeline.schedule == "1f1b" and cfg.cluster_config().pipeline.schedule == "1f1b"
    assert build_run_config(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"^pipeline\.schedule='pipedream' must be one of gpipe, 1f1b$"):
        load_run_config(["federation=tiny", "pipeline.schedule=pipedream"], data_dir=str(data_dir))
    with pytest.raises(ConfigError, match="decoder_update=joint"):
        load_run_config(
            ["federation=tiny", "pipeline.schedule=1f1b", "federation.decoder_update=joint"], data_dir=str(data_dir)
        )


# -- (d) C7 under 1F1B, by hand -----------------------------------------------------------------------------
def workload(schedule: str) -> Workload:
    return uniform_workload(4, 1e6, 1e3, 1000.0, 50.0, 20, schedule=schedule)


def test_c7_activation_term_follows_the_schedule_by_hand():
    gp, one = workload("gpipe"), workload("1f1b")
    static = 1000.0 * (2 + 2)  # weights + gradients + Adam's two slots
    assert gp.block_memory_bytes() == one.block_memory_bytes() == static + 50.0 * 20  # the whole batch
    # b = 20, m = 8: b_hat = ceil(20 / 8) = 3; S = 3: stage k holds min(8, 3 - k) micro-batches of 3 samples
    for k, held in enumerate((3, 2, 1)):
        assert held_micro_batches("1f1b", 8, 3, k) == held and held_micro_batches("gpipe", 8, 3, k) == 8
        assert one.block_memory_bytes(8, 3, k) == static + 50.0 * 3 * held
        assert gp.block_memory_bytes(8, 3, k) == static + 50.0 * 20
        assert one.stage_memory_bytes(2, 8, 3, k) == 2 * (static + 50.0 * 3 * held)
    # m <= S - k: every micro-batch is alive at once, capped at the batch (ceil(20 / 3) * 3 = 21 > 20)
    assert held_samples("1f1b", 20, 3, 3, 0) == 20 and one.block_memory_bytes(3, 3, 0) == static + 50.0 * 20
    assert workload("1f1b").to_dict()["schedule"] == "1f1b"
    assert Workload.from_dict(one.to_dict()) == one
    with pytest.raises(ConfigError, match="schedule"):
        workload("zigzag")


def cluster(schedule: str, memory: float) -> ClusterModel:
    K = 3
    return ClusterModel(
        cluster=0, num_blocks=4, batch_size=20, steps=1, flops_per_sample_block=3e6, activation_bits=1e4,
        flops_per_second=np.full(K, 1e9), flops_per_cycle=np.full(K, 1.0), f_hz=np.full(K, 1e9),
        d2d_rate=np.full(K, 1e8), d2d_power=np.full(K, 0.1), memory_cap=np.full(K, int(memory // 5000.0)),
        energy_max=1e9, kappa=1e-28, memory_bytes=np.full(K, memory), block_static_bytes=4000.0,
        saved_bytes_per_sample=50.0, schedule=schedule,
    )  # fmt: skip


def test_dssra_memory_cap_follows_the_schedule_by_hand():
    memory = 12_000.0  # GPipe: gamma_0 = 4000 + 50 x 20 = 5000 -> 2 blocks per device, whatever m
    gp, one = cluster("gpipe", memory), cluster("1f1b", memory)
    assert list(gp.block_cap(8)) == [2, 2, 2]
    # 1F1B, m = 8, b_hat = 3: the solver's bound is the first stage of S = min(K, L) = 3 stages, 3 micro-batches:
    # gamma_0 = 4000 + 50 x 9 = 4450 -> floor(12000 / 4450) = 2
    assert list(one.block_cap(8)) == [2, 2, 2]
    # m = 20, b_hat = 1: gamma_0 = 4000 + 50 x 3 = 4150 -> 2; an [M, K] table for an array of m
    assert one.block_cap(np.array([1, 20])).tolist() == [[2, 2, 2], [2, 2, 2]]
    # a given partition: device k is stage j of S = 2; stage 0 holds min(8, 2) x 3 = 6 samples, stage 1 holds 3
    bigger = cluster("1f1b", 8_800.0)  # 4000 + 300 = 4300 -> 2 blocks; 4000 + 150 = 4150 -> 2; GPipe: 1
    assert list(bigger.stage_memory_cap((0, 2, 2), 8)) == [1, 2, 2]
    assert list(cluster("gpipe", 8_800.0).stage_memory_cap((0, 2, 2), 8)) == [1, 1, 1]
    fixed_segments(bigger, 1.0, [0.0] * 4, (0, 2, 2), 8)  # meets C7 under 1F1B
    with pytest.raises(InfeasiblePlanError, match="C7"):
        fixed_segments(cluster("gpipe", 8_800.0), 1.0, [0.0] * 4, (0, 2, 2), 8)
    tight = cluster("1f1b", 8_400.0)  # stage 0: 4300 x 2 = 8600 > 8400, stage 1: 4150 x 2 = 8300 fits
    assert list(tight.stage_memory_cap((2, 2, 0), 8))[:2] == [1, 2]


# -- Ray: the same numbers with one actor per device ----------------------------------------------------------
@pytest.mark.e2e
def test_1f1b_on_ray_runs_each_actor_in_1f1b_order_and_equals_the_plain_model(ray_session):
    from tests.runtimes import runtime

    # the translation Transformer: its device actors import torch alone (BERT's import transformers' BERT too)
    model = tiny_transformer(29, 16, 32, L)
    for part in model.parts():
        part.double()
    batches = [translation_batch(29, B=16, T=9, seed=seed) for seed in (7, 8)]
    ref, ref_losses = plain_steps(model, batches, ADAM)
    rt = runtime(backend="ray", actor_threads=1, precision="fp32", prestart_devices=False)
    traces: list = []
    *parts, losses = pipeline_steps(model, batches, ADAM, "1f1b", 2, 4, runtime=rt, traces=traces)
    for step in traces:  # each actor ran its calls in its 1F1B order
        want = [one_f_one_b_order(k, 2, 4) for k in range(2)]
        assert [[(kind, i) for kind, i, _, _ in trace] for trace in step] == want
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    assert_same_parts(*parts, ref)


# -- (c) through the real data plane: the server's decoder updated once per step, as under GPipe ------------
def run_through_data_plane(data_dir, schedule: str, m: int = 4, steps: int = 2):
    """One CU, one round of ``steps`` steps on S = 2 devices, over the gRPC data plane to the server's decoder
    (the real CU code path, as tests/fl/cu/test_split_equivalence.py); the decoder's parameters, the CU's reply and
    the data plane's step counters ((the decoder before, after), weights, metrics, steps served)."""
    from collapipe_flwr.dssra.plan import ClusterPlan
    from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, train_round
    from collapipe_flwr.fl.cu.state_store import CUStateStore
    from collapipe_flwr.fl.server.server_state import ServerState

    overrides = [
        "task=translation", "model=transformer_tiny", "federation=tiny", "network=small",
        "federation.num_clusters=1", f"federation.local_steps={steps}", "runtime.backend=local", "task.batch_size=8",
        "model.dropout=0.0", "runtime.precision=fp32", f"pipeline.schedule={schedule}",
    ]  # fmt: skip
    cfg = load_run_config(overrides, data_dir=str(data_dir))
    server = ServerState.build(cfg)
    try:
        initial = {k: v.detach().clone() for k, v in server.model.head.state_dict().items()}
        L, K = len(server.model.blocks), len(server.planner.devices_of(0))
        delta = [0] * K
        delta[0], delta[-1] = L // 2, L - L // 2
        plan = ClusterPlan(cluster=0, selected=True, channel=0, power_w=0.1, S=2, m=m, delta=tuple(delta))
        server.decoder.open_round(1, [0])
        instructions = server.instructions_for(1, plan)
        weights, metrics = train_round(
            CUStateStore(),
            ClusterIdentity(0, 1, str(data_dir)),
            copy.deepcopy(server.global_model.array_record()),
            instructions,
        )
        metrics = metrics.to_record()  # the report as it travels (RoundReport.to_record)
        server.decoder.close_round()
        decoder = {k: v.detach().clone() for k, v in server.model.head.state_dict().items()}
        served = server.decoder.steps_served()
    finally:
        server.shutdown()
    return (initial, decoder), weights, metrics, served


@pytest.mark.e2e
def test_1f1b_through_the_data_plane_updates_the_decoder_as_gpipe(data_dir, monkeypatch):
    """One step of m = 4 micro-batches: the same z_enc reach the decoder in 4 exchanges instead of 1, the decoder
    sums their gradients and steps once, so its parameters after the step equal GPipe's (float32, the same sums in
    the same order: GPipe's step here takes its micro-batches one head call each, as 1F1B must, where it would
    stack them into one call, whose sums round otherwise, tests/pipeline/test_head_runs.py); the loss and the CU's
    gradients too."""
    from collapipe_flwr.fl.server.decoder import frame_service
    from collapipe_flwr.fl.server.decoder.frame_service import FrameService
    from collapipe_flwr.pipeline.head import head_step

    parts = []
    run_part = FrameService._run_part
    monkeypatch.setattr(
        FrameService, "_run_part", lambda self, req, step: parts.append(req.part) or run_part(self, req, step)
    )

    def one_call_each(head, optimizer, z_enc, micro_batches, terms=None, breaks=()):
        return head_step(head, optimizer, z_enc, micro_batches, terms, range(1, len(z_enc)))

    monkeypatch.setattr(frame_service, "head_step", one_call_each)
    (initial, gp_decoder), gp_weights, gp_metrics, gp_served = run_through_data_plane(data_dir, "gpipe", steps=1)
    assert parts == []
    (_, decoder), weights, metrics, served = run_through_data_plane(data_dir, "1f1b", steps=1)
    assert parts == [0, 1, 2, 3]  # one exchange per micro-batch
    assert served == gp_served == {0: 1}  # counted as one step
    assert metrics["train-losses"] == pytest.approx(gp_metrics["train-losses"], rel=1e-6)
    moved = 0
    for name, w in gp_decoder.items():
        torch.testing.assert_close(decoder[name], w, rtol=1e-6, atol=1e-7)
        moved += int(not torch.equal(w, initial[name]))
    assert moved  # the decoder did take its step
    got = unpack_weights(weights)
    for part, tensors in unpack_weights(gp_weights).items():  # the CU's embedding and encoder after the step
        for name, w in tensors.items():
            torch.testing.assert_close(got[part][name], w, rtol=1e-5, atol=1e-6)
