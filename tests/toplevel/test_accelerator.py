"""runtime.device: resolution, its errors, and (on a machine with CUDA) the GPU path checked against the plain
CPU model. The CUDA tests skip cleanly where torch sees no GPU."""

from __future__ import annotations

import copy

import pytest
import torch

from collapipe_flwr.accelerator import batch_to, module_device, resolve_device, to_host
from collapipe_flwr.config import load_run_config
from collapipe_flwr.errors import ConfigError, DeviceFailure
from collapipe_flwr.fl.server.evaluator import on_device
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.executors import LocalStages, StageSpec, creation_error
from collapipe_flwr.pipeline.head import LocalHead, head_step
from collapipe_flwr.pipeline.optim import OptimizerSpec
from tests.pipeline.test_transparency import (
    make_batch,
    make_model,
    named_weights,
    reference_step,
)
from tests.runtimes import runtime

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
without_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without CUDA")
SGD_UNIT = OptimizerSpec(name="sgd", lr=1.0)
ADAM = OptimizerSpec(name="adam", lr=1e-2)


# -- resolution and errors (every machine) ----------------------------------------------------------------
def test_resolution_follows_what_the_process_sees(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"runtime.server_device=cuda but this process sees no CUDA GPU.*auto or cpu"):
        resolve_device("cuda", "runtime.server_device")
    with pytest.raises(ConfigError, match=r"--device='gpu' must be one of auto, cpu, cuda"):
        resolve_device("gpu", "--device")


def test_config_refuses_a_bad_device_and_gpu_share():
    with pytest.raises(ConfigError, match=r"runtime.device='gpu' must be one of auto, cpu, cuda"):
        load_run_config(["runtime.device=gpu"])
    with pytest.raises(ConfigError, match=r"runtime.server_device='tpu'"):
        load_run_config(["runtime.server_device=tpu"])
    with pytest.raises(ConfigError, match=r"runtime.actor_num_gpus=2.0 must be in \[0, 1\]"):
        load_run_config(["runtime.actor_num_gpus=2"])
    rt = load_run_config(["runtime.device=auto"]).runtime
    assert (rt.device, rt.head_device) == ("auto", "auto")  # server_device "" follows runtime.device
    assert load_run_config(["runtime.server_device=cpu", "runtime.device=auto"]).runtime.head_device == "cpu"


def test_cpu_stays_the_default():
    rt = load_run_config([]).runtime
    assert (rt.device, rt.server_device, rt.actor_num_gpus) == ("cpu", "", 0.0)


@without_cuda
def test_a_stage_asked_for_cuda_without_one_fails_at_once():
    with pytest.raises(ConfigError, match="runtime.device=cuda but this process sees no CUDA GPU"):
        LocalStages([StageSpec(0, torch.nn.ModuleList())], SGD_UNIT, runtime(device="cuda"))


@pytest.mark.e2e
@without_cuda
@pytest.mark.usefixtures("ray_session")
def test_a_ray_actor_asked_for_cuda_names_the_cause():
    """The error raised in the actor's constructor reaches the CU's one-line DeviceFailure."""
    model = make_model("bert")
    with pytest.raises(DeviceFailure, match=r"device 0's Ray actor failed to start: .*runtime.device=cuda but"):
        ClusterPipeline(model.embedding, model.blocks, (6,), SGD_UNIT, runtime=runtime(backend="ray", device="cuda"))


def test_creation_error_takes_the_last_error_line():
    text = "The actor died because of an error raised in its creation task\nTraceback...\nConfigError: no GPU here\n"
    assert creation_error(RuntimeError(text)) == "ConfigError: no GPU here"
    assert creation_error(RuntimeError("the actor died")) == ""


def test_cpu_helpers_move_nothing():
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "note": "kept"}
    moved = batch_to(batch, torch.device("cpu"))
    assert moved["input_ids"] is batch["input_ids"] and moved["note"] == "kept"
    t = torch.zeros(3)
    assert to_host(t) is t
    model = make_model("bert")
    assert on_device(model, torch.device("cpu")) is model
    assert module_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters


# -- the GPU path (skips without CUDA) --------------------------------------------------------------------
def gpu_step(model, batch, spec, delta, m, backend, head_device):
    model = copy.deepcopy(model)
    model.head.to(head_device)
    head = LocalHead(model.head, spec)
    with ClusterPipeline(
        model.embedding, model.blocks, delta, spec, runtime=runtime(backend=backend, device="cuda", actor_num_gpus=0.25)
    ) as pipe:
        before = named_weights(model.embedding, pipe.encoder_state_dict(), model.head)
        result = pipe.train_step(batch, m, head)
        after = named_weights(model.embedding, pipe.encoder_state_dict(), model.head)
    return result, before, after


@needs_cuda
@pytest.mark.parametrize("family", ["transformer", "bert"])
@pytest.mark.parametrize("head_device", ["cpu", "cuda"])
def test_stages_on_the_gpu_match_the_plain_cpu_model(family, head_device):
    model, batch = make_model(family), make_batch(family)
    ref_loss, ref_count, ref_grads, _ = reference_step(model, batch, SGD_UNIT)
    result, before, after = gpu_step(model, batch, SGD_UNIT, (2, 3, 1), 4, "local", head_device)
    assert result.count == ref_count
    assert result.loss == pytest.approx(ref_loss, rel=1e-5)
    for name, g_ref in ref_grads.items():
        g = (before[name] - after[name]).cpu()
        torch.testing.assert_close(g, g_ref if g_ref is not None else torch.zeros_like(g), rtol=1e-4, atol=1e-6)
    assert all(v.device.type == "cpu" for k, v in after.items() if k.startswith("blocks."))  # weights leave as CPU


@needs_cuda
@pytest.mark.usefixtures("ray_session")
def test_ray_stages_share_one_gpu_and_match_the_plain_model():
    model, batch = make_model("bert"), make_batch("bert")
    _, _, _, ref_after = reference_step(model, batch, ADAM)
    _, _, after = gpu_step(model, batch, ADAM, (3, 3), 2, "ray", "cuda")
    for name, w_ref in ref_after.items():
        torch.testing.assert_close(after[name].cpu(), w_ref, rtol=1e-4, atol=1e-6)


@needs_cuda
def test_head_step_on_the_gpu_returns_cpu_gradients_equal_to_the_cpu_head():
    model, batch = make_model("bert"), make_batch("bert")
    z = [model.encode(batch["input_ids"], batch["attention_mask"]).detach()]
    cpu_loss, cpu_grads = head_step(copy.deepcopy(model.head), None, z, [batch])
    gpu_loss, gpu_grads = head_step(copy.deepcopy(model.head).cuda(), None, z, [batch])
    assert gpu_grads[0].device.type == "cpu"
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    torch.testing.assert_close(gpu_grads[0], cpu_grads[0], rtol=1e-4, atol=1e-7)


@needs_cuda
def test_evaluation_copies_on_the_gpu_score_like_the_cpu_model():
    model, batch = make_model("bert"), make_batch("bert")
    gpu = on_device(model, resolve_device("cuda"))
    assert gpu is not model and module_device(model.blocks).type == "cpu"  # the server's modules never move
    with torch.no_grad():
        ref = model.head.loss_terms(
            model.encode(batch["input_ids"], batch["attention_mask"]), batch["attention_mask"], batch
        )
        moved = batch_to(batch, module_device(gpu.embedding))
        got = gpu.head.loss_terms(
            gpu.encode(moved["input_ids"], moved["attention_mask"]), moved["attention_mask"], moved
        )
    assert float(got[0]) == pytest.approx(float(ref[0]), rel=1e-5)
