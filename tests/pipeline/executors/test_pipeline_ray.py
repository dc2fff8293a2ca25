"""ClusterPipeline with one Ray actor per device: real overlap of stages, and device failures named.

Each actor start costs seconds (a fresh worker imports torch), so the tests share pipelines where they can, and run
the translation Transformer, whose blocks are torch's own, wherever the model family is not what they test: BERT's
blocks make each actor import transformers' BERT too (about 6 s more per start here). The one test about that import
runs BERT."""

from __future__ import annotations

import contextlib
import math
import os
import time

import pytest
import torch

from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.system.devices import DeviceProfile
from tests.runtimes import DEVICE_RESOURCES, runtime
from tests.tiny_models import tiny_bert, tiny_transformer, translation_batch

pytestmark = pytest.mark.e2e

ray = pytest.importorskip("ray")
ADAM = OptimizerSpec(name="adam", lr=1e-3)


VOCAB = 50


def tiny(hidden=16, layers=4):
    """The executor's test model: a tiny translation Transformer (torch-only blocks)."""
    return tiny_transformer(VOCAB, hidden, 4 * hidden, layers)


def batch(B=8, T=8):
    return translation_batch(VOCAB, B, T)


def bert(hidden=16, layers=4):
    return tiny_bert(VOCAB, hidden, 4 * hidden, layers, 3)


def bert_batch(B=8, T=8):
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1, 50, (B, T), generator=g),
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "labels": torch.randint(0, 3, (B, T), generator=g),
    }


def profile(speed: float) -> DeviceProfile:
    return DeviceProfile(f_hz=1e9 * speed, flops_per_cycle=4, memory_bytes=1e12, d2d_power_w=0.1)


def overlaps(a, b) -> bool:
    return a[2] < b[3] and b[2] < a[3]


def _overlapping(first, second) -> bool:
    fwd0 = {t[1]: t for t in first if t[0] == "F"}
    fwd1 = {t[1]: t for t in second if t[0] == "F"}
    bwd0 = {t[1]: t for t in first if t[0] == "B"}
    bwd1 = {t[1]: t for t in second if t[0] == "B"}
    return any(overlaps(fwd1[i], fwd0[i + 1]) for i in range(3)) and any(
        overlaps(bwd0[i], bwd1[i - 1]) for i in range(1, 4)
    )


@contextlib.contextmanager
def two_warm_device_actors():
    """(pipe, head, batch): 4 Transformer blocks split (2, 2) over two Ray device actors, one warm-up step taken."""
    model = tiny(hidden=128, layers=4)
    data = batch(B=8, T=64)
    with ClusterPipeline(
        model.embedding, model.blocks, (2, 2), ADAM, runtime=runtime(backend="ray", actor_threads=1)
    ) as pipe:
        head = LocalHead(model.head, ADAM)
        pipe.train_step(data, 4, head)  # warm-up
        yield pipe, head, data


def test_stages_work_on_different_micro_batches_at_the_same_time(ray_session):
    with two_warm_device_actors() as (pipe, head, data):
        # Overlap is a capability, not a guarantee on a loaded 2-core machine: keep the traces of a few
        # steps and require it in at least one of them.
        steps = []
        for _ in range(4):
            pipe.train_step(data, 4, head)
            steps.append(pipe.traces())
            if _overlapping(*steps[-1]):
                break
        first, second = steps[-1]

        def head_that_outlives_device_1(z_enc, micro_batches, lr_factor):
            pipe.stages.kill(1)  # device 1 dies between the forward and the backward pass
            return head(z_enc, micro_batches, lr_factor)

        with pytest.raises(DeviceFailure, match=r"^device 1 died during the step"):
            pipe.train_step(data, 4, head_that_outlives_device_1)
    fwd0 = {mb: t for t in first if t[0] == "F" for mb in [t[1]]}
    fwd1 = {mb: t for t in second if t[0] == "F" for mb in [t[1]]}
    bwd0 = {mb: t for t in first if t[0] == "B" for mb in [t[1]]}
    bwd1 = {mb: t for t in second if t[0] == "B" for mb in [t[1]]}
    assert sorted(fwd0) == sorted(fwd1) == sorted(bwd0) == list(range(4))
    # order: forwards ascending, backwards descending on every stage (GPipe)
    assert [t[1] for t in first] == [0, 1, 2, 3, 3, 2, 1, 0]
    # stage 1 on micro-batch i while stage 0 is on i+1 (at least once in each pass)
    assert any(overlaps(fwd1[i], fwd0[i + 1]) for i in range(3)), (first, second)
    assert any(overlaps(bwd0[i], bwd1[i - 1]) for i in range(1, 4)), (first, second)
    # dependencies hold: stage 1 starts micro-batch i after stage 0 finished it
    assert all(fwd1[i][2] >= fwd0[i][3] - 1e-3 for i in range(4)), (first, second)


def test_each_device_reports_the_cpu_seconds_its_own_process_spent(ray_session):
    """StageSeconds.cpu (``device-cpu-seconds``) against the OS's count for the same processes (psutil by pid)
    across three steps in a row: never more than the OS counted, and most of it (the actors idle between steps)."""
    psutil = pytest.importorskip("psutil")
    with two_warm_device_actors() as (pipe, head, data):
        procs = {k: psutil.Process(p.pid) for k, p in pipe.stages.processes().items()}
        assert procs[0].pid != procs[1].pid != os.getpid()
        before = {k: sum(proc.cpu_times()[:2]) for k, proc in procs.items()}
        reported = {0: 0.0, 1: 0.0}
        for _ in range(3):
            timings = pipe.train_step(data, 4, head).timings
            for k in reported:
                reported[k] += timings.device_cpu[k]
        counted = {k: sum(proc.cpu_times()[:2]) - before[k] for k, proc in procs.items()}
    for k in (0, 1):
        assert 0.0 < reported[k] <= counted[k] + 0.05, (reported, counted)  # /proc counts in 10 ms ticks
        assert reported[k] >= 0.5 * counted[k], (reported, counted)


def test_slow_device_times_out_and_is_named(ray_session):
    """Device 0 (the FIRST stage) stalls: the wait ends after timeout_s and blames device 0, not the
    last stage whose output the CU was waiting for."""
    model = tiny()
    devices = [profile(1.0), profile(1000.0)]  # device 0 sleeps ~999x its compute time
    with ClusterPipeline(
        model.embedding,
        model.blocks,
        (3, 1),
        ADAM,
        devices=devices,
        runtime=runtime(backend="ray", emulate=True, device_timeout_s=1.0),
    ) as pipe:
        with pytest.raises(DeviceFailure, match=r"^device 0 gave no answer within device_timeout_s=1s"):
            pipe.train_step(batch(), 2, LocalHead(model.head, ADAM))


def test_device_resource_pins_each_device_actor_to_the_box_offering_it(ray_session):
    if any(ray.cluster_resources().get(name) != 1.0 for name in DEVICE_RESOURCES):
        pytest.skip("Ray was started elsewhere without the custom device resources")
    model = tiny()
    boxes = runtime(backend="ray", actor_threads=1, device_resource="edge_box_{k}")
    with ClusterPipeline(model.embedding, model.blocks, (2, 2), ADAM, runtime=boxes) as pipe:
        loss = pipe.train_step(batch(), 2, LocalHead(model.head, ADAM)).loss
        held = ray.available_resources()
        # each device actor holds the whole unit of its own box's resource while it lives
        assert all(held.get(name, 0.0) == 0.0 for name in DEVICE_RESOURCES), held
    assert loss == loss  # a finite step ran on the pinned actors
    deadline = time.time() + 30
    while time.time() < deadline and ray.available_resources().get("edge_box_1", 0.0) != 1.0:
        time.sleep(0.2)
    assert ray.available_resources().get("edge_box_1", 0.0) == 1.0  # released with the pipeline


def test_a_killed_device_actor_is_named_and_the_pipeline_recovers_without_it(ray_session):
    model = tiny()
    start = {k: v.clone() for k, v in model.blocks.state_dict().items()}
    with ClusterPipeline(
        model.embedding, model.blocks, (2, 1, 1), ADAM, runtime=runtime(backend="ray", actor_threads=1)
    ) as pipe:
        head = LocalHead(model.head, ADAM)
        pipe.train_step(batch(), 2, head)
        ray.kill(pipe.stages.devices[1], no_restart=True)
        with pytest.raises(DeviceFailure) as failure:
            pipe.train_step(batch(), 2, head)
        assert failure.value.device == 1
        pipe.recover((3, 0, 1), start, [1])
        assert pipe.placement.delta == (3, 0, 1) and 1 not in pipe.stages.devices
        assert torch.equal(
            pipe.encoder_state_dict()["0.layer.self_attn.in_proj_weight"], start["0.layer.self_attn.in_proj_weight"]
        )
        assert math.isfinite(pipe.train_step(batch(), 2, head).loss)


def test_pinned_device_actors_run_on_their_own_cores_and_train_as_the_plain_model(ray_session):
    """runtime.pin_threads=true: each stage's actor process runs on its core set (read from outside by
    pid), re-pinned when S changes; the weights after the steps equal the whole model trained in one process."""
    import copy

    from collapipe_flwr.pipeline.executors import core_sets, usable_cores_list

    model = tiny()
    for part in model.parts():  # fp64: the key bias's gradient is zero but for rounding, which Adam in fp32 scales up
        part.double()
    data = batch()
    ref = copy.deepcopy(model)
    ref_opt = ADAM.build(ref.parameters())
    for _ in range(2):
        ref_opt.zero_grad()
        loss_sum, count = ref.loss_terms(data)
        (loss_sum / count).backward()
        ref_opt.step()
    cores = usable_cores_list()
    with ClusterPipeline(
        model.embedding, model.blocks, (2, 2), ADAM, runtime=runtime(backend="ray", pin_threads="true")
    ) as pipe:
        head = LocalHead(model.head, ADAM)
        pipe.train_step(data, 2, head)
        pids = {k: p.pid for k, p in pipe.stages.processes().items()}
        want = core_sets(cores, 2, "true")
        assert [set(os.sched_getaffinity(pids[k])) for k in (0, 1)] == [set(c) for c in want]
        pipe.placement.repartition((4, 0))  # S = 1: device 0 alone, on the S = 1 core set
        assert set(os.sched_getaffinity(pids[0])) == set(core_sets(cores, 1, "true")[0])
        pipe.train_step(data, 4, head)
        got = pipe.encoder_state_dict()
    for name, w in ref.blocks.state_dict().items():
        torch.testing.assert_close(got[name], w, rtol=1e-5, atol=1e-7)


def test_an_idle_device_has_the_blocks_code_imported_before_a_plan_uses_it(ray_session):
    """runtime.prestart_devices: a device actor started holding no blocks imports the code of the encoder's
    blocks in the background (here transformers' BERT layer), so the first segment a later plan moves onto it
    waits for no import (3-4 s at BERT size on this machine, against 0.4-0.6 s for a later move); the moved
    blocks then train there."""
    model = bert()
    needed = ["transformers.models.bert.modeling_bert", "collapipe_flwr.models.bert"]  # the layer's own modules
    rt = runtime(backend="ray", prestart_devices=True)
    with ClusterPipeline(model.embedding, model.blocks, (4, 0, 0), ADAM, [profile(1.0)] * 3, runtime=rt) as pipe:
        assert sorted(pipe.stages.processes()) == [0, 1, 2]  # devices 1 and 2 alive, idle
        # Ray runs an actor's calls in order: this one answers after the warm-up the pipeline queued
        assert pipe.stages.missing_modules(2, needed) == []
        pipe.placement.repartition((0, 0, 4))
        loss = pipe.train_step(bert_batch(), 2, LocalHead(model.head, ADAM)).loss
        assert math.isfinite(loss)
