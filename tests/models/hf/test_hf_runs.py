"""Hugging Face causal LMs in federated runs (issue 29, step 2): the causal_lm task, the ``family: hf`` model
config (inline architecture or a local folder), LoRA as config, adapter-only uploads, DSSRA's uplink term
and the save / evaluate round trip.

References independent of the code under test: perplexity recomputed from the un-split Hugging Face model's
logits; the uplink measured on the tensors the CUs actually put in their replies (an InProcessGrid that
records them); the saved model re-evaluated by ``python -m collapipe_flwr.apps.evaluate``. Tiny GPT-2s built from
configs, a byte-level BPE trained on the Multi30K English side; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace

import pytest
import torch
from torch.nn import functional as F

from collapipe_flwr.apps import evaluate
from collapipe_flwr.config import compose, load_run_config
from collapipe_flwr.config.flower_keys import hydra_overrides
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.messages import TRAIN, WEIGHTS, unpack_weights
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.models.hf import load_hf_model
from collapipe_flwr.models.hf_arch import inline_config
from collapipe_flwr.models.trainable import tensor_bytes
from collapipe_flwr.system.workload import Workload, measure_workload
from collapipe_flwr.tasks.registry import build_task
from collapipe_flwr.tasks.spec import parse_model
from tests.inprocess_grid import InProcessGrid
from tests.task_specs import specs

RUN = (
    "task=causal_lm model=gpt2_tiny federation=tiny network=small federation.num_rounds=3 federation.local_steps=4 "
    "runtime.backend=local runtime.precision=fp32 task.batch_size=16 eval.max_examples=128 eval.every=1 "
    "eval.at_start=true"
)


def _task(data_dir, cache, model_over=None):
    return build_task(*specs("causal_lm", "gpt2_tiny", None, model_over), data_dir, seed=0, cache_dir=cache)


# ----------------------------------------------------------------------------- task and config
def test_perplexity_is_exp_of_the_mean_token_nll_of_the_unsplit_model(data_dir, cache):
    task = _task(data_dir, cache)
    model = task.build_model(seed=0)
    got = task.evaluate(model, max_examples=40, batch_size=16)
    # the same weights as an un-split GPT2LMHeadModel: same seed, same config (LoRA's B = 0 changes nothing)
    spec = task.model_spec
    assert spec.hf is not None
    config = inline_config(
        "gpt2", {**spec.sizes, "max_len": spec.max_len}, len(task.tokenizer()), 0.0, task.special_ids()
    )
    torch.manual_seed(0)
    net = load_hf_model(config).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, 40, 16):
            batch = task.collate(task.features("val")[start : min(start + 16, 40)])
            logits = net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            nll += float(F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100, reduction="sum"))
            count += int((targets != -100).sum())
    assert got["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert got["loss"] == pytest.approx(nll / count, rel=1e-5)
    # every line is [BOS] + tokens + [EOS]; padding is never a target
    first = task.features("val")[0]["ids"]
    ids = task.special_ids()
    assert first[0] == ids["bos_token_id"] and first[-1] == ids["eos_token_id"]


@pytest.mark.parametrize(
    "over,match",
    [
        ({"lora": {"enabled": True, "r": 0}}, "model.lora.r=0"),
        ({"lora": {"enabled": True, "rank": 4}}, "model.lora.rank"),
        ({"lora": {"enabled": True, "target_modules": "c_attn"}}, "model.lora.target_modules"),
        ({"model_type": "t5"}, "model.model_type='t5'"),
        ({"hf_folder": "/nonexistent/gpt2"}, "model.allow_hub=true"),
    ],
)
def test_a_bad_hf_model_key_is_one_line_naming_it(over, match):
    with pytest.raises(ConfigError, match=match) as err:
        specs("causal_lm", "gpt2_tiny", None, over)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_a_lora_key_with_the_task_alone_reaches_its_default_model(enabled):
    """docs/hf_models.md's ``overrides="task=causal_lm model.lora.enabled=false"`` (and the flat ``task`` key with
    ``model.lora.*`` in overrides, as results/hf_lora.py runs it): the config's default model has no ``lora``, so
    the key used to fail to override before the task's default model (gpt2_tiny) was filled in."""
    overrides = hydra_overrides({"task": "causal_lm", "overrides": f"model.lora.enabled={enabled} model.lora.r=2"})
    composed = compose(overrides)
    assert composed["model"]["name"] == "gpt2_tiny"
    assert composed["model"]["lora"]["enabled"] is (enabled == "true") and composed["model"]["lora"]["r"] == 2
    with pytest.raises(ConfigError, match="model.nokey"):  # a key the default model lacks too is still refused
        compose(["task=causal_lm", "model.nokey=1"])
    with pytest.raises(ConfigError, match="model.lora.enabled"):  # and so is one the chosen model lacks
        compose(["task=causal_lm", "model=transformer_small", "model.lora.enabled=false"])


def test_privacy_with_lora_is_refused_at_start_up(data_dir):
    with pytest.raises(ConfigError, match="model.lora.enabled"):
        load_run_config(RUN.split() + ["privacy=local"], data_dir=str(data_dir))


def test_a_local_model_folder_gives_the_sizes_and_its_own_tokenizer(data_dir, cache, tmp_path):
    """A user's folder (config.json, weights, tokenizer files) is what the run trains: sizes read from it."""
    inline = _task(data_dir, cache)
    tokenizer = inline.tokenizer()
    config = inline_config(
        "gpt2",
        {"hidden": 32, "n_heads": 2, "d_ff": 64, "layers": 3, "max_len": 80},
        len(tokenizer),
        0.0,
        inline.special_ids(),
    )
    load_hf_model(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    task_spec, _ = specs("causal_lm", "gpt2_tiny")
    raw = {"name": "mine", "family": "hf", "hf_folder": str(tmp_path), "lora": {"enabled": True}}
    spec = parse_model(raw, task_spec)
    assert spec.sizes == {"hidden": 32, "n_heads": 2, "d_ff": 64, "layers": 3} and spec.max_len == 80
    assert parse_model(spec.to_raw(), task_spec) == spec
    with pytest.raises(ConfigError, match="model.layers=4 but"):
        parse_model({**raw, "layers": 4}, task_spec)
    task = build_task(task_spec, spec, data_dir, seed=0, cache_dir=cache)
    model = task.build_model(seed=0)
    assert model.num_blocks == 3 and task.tokenizer().name_or_path == str(tmp_path)
    assert all("lora_" in n for n, p in model.blocks.named_parameters() if p.requires_grad)
    # the same folder without its weights is refused when the config is read, not after the run started
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="holds no weights") as err:
        parse_model(raw, task_spec)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- federated runs
class _RecordingGrid(InProcessGrid):
    """Records, per train message and reply, the tensors it carries (part -> name -> tensor)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.downloads: list[dict] = []
        self.uploads: list[dict] = []

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == TRAIN:
                self.downloads.append(unpack_weights(m.content.array_records[WEIGHTS]))
        replies = super().send_and_receive(messages, timeout)
        for r in replies:
            if r.metadata.message_type == TRAIN and not r.has_error():
                self.uploads.append(unpack_weights(r.content.array_records[WEIGHTS]))
        return replies


def _run(data_dir, out, lora: bool):
    grid = _RecordingGrid(2, str(data_dir))
    overrides = f"{RUN} run_name=lora_{lora} model.lora.enabled={str(lora).lower()}"
    with contextlib.redirect_stderr(io.StringIO()):
        folder = run_server(grid, {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(out)})
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    return folder, rounds, grid


@pytest.fixture(scope="module")
def runs(data_dir, cache, tmp_path_factory):
    """The same 3-round, 2-CU run with LoRA and with full fine-tuning."""
    out = tmp_path_factory.mktemp("runs")
    return {lora: _run(data_dir, out, lora) for lora in (True, False)}


@pytest.mark.e2e
def test_a_lora_run_learns_and_uploads_only_adapters(runs):
    folder, rounds, grid = runs[True]
    losses = [r["train_loss"] for r in rounds[1:]]
    perplexity = [r["val_perplexity"] for r in rounds]
    assert losses[-1] < losses[0] and perplexity[-1] < perplexity[0]
    assert len(grid.uploads) == 6  # 2 CUs x 3 rounds
    for upload in grid.uploads:
        assert set(upload) == {"encoder"}  # a frozen embedding, the head on the server
        assert upload["encoder"] and all(".lora_A." in n or ".lora_B." in n for n in upload["encoder"])
    # each CU's first download carries the frozen base once; later ones only the adapters
    first, later = grid.downloads[:2], grid.downloads[2:]
    assert all("embedding" in d and "0.layer.attn.c_attn.base_layer.weight" in d["encoder"] for d in first)
    assert all(set(d) == {"encoder"} and d["encoder"].keys() == grid.uploads[0]["encoder"].keys() for d in later)


@pytest.mark.e2e
def test_lora_uplink_is_20x_smaller_and_dssra_plans_with_it(runs):
    lora_up = [tensor_bytes(u) for u in runs[True][2].uploads]
    full_up = [tensor_bytes(u) for u in runs[False][2].uploads]
    assert len(set(lora_up)) == 1 and len(set(full_up)) == 1
    # each CU records what its reply carried (clients.<n>.upload-bytes in rounds.jsonl): the bytes measured here
    for lora, sent in ((True, lora_up), (False, full_up)):
        recorded = [c["upload-bytes"] for r in runs[lora][1][1:] for c in r["clients"].values()]
        assert sorted(recorded) == sorted(sent)
    assert full_up[0] >= 20 * lora_up[0], (full_up[0], lora_up[0])
    # full fine-tuning uploads the embedding and every TEB weight
    assert set(runs[False][2].uploads[0]) == {"embedding", "encoder"}
    # DSSRA's uplink term (eq. 11 bits in eq. 26 / C9) counts what travels: the planned uplink shrinks
    lora_plan, full_plan = runs[True][1][1]["modelled"], runs[False][1][1]["modelled"]
    saved = full_plan["uplink_bits"] - lora_plan["uplink_bits"]  # the same z_enc per step in both
    assert saved == pytest.approx(8.0 * (full_up[0] - lora_up[0]), rel=0.01)
    assert lora_plan["round_delay_s"] < full_plan["round_delay_s"]


@pytest.mark.e2e
def test_a_saved_lora_run_holds_the_adapters_and_evaluates_to_its_last_perplexity(runs):
    folder, rounds, _ = runs[True]
    meta = json.loads((folder / "model" / "model.json").read_text())
    assert meta["tensors"] == "trainable" and meta["config"]["model"]["hf_folder"] == ""
    from safetensors.torch import load_file

    encoder = load_file(str(folder / "model" / "encoder.safetensors"))
    assert encoder and all(".lora_" in name for name in encoder)
    assert load_file(str(folder / "model" / "embedding.safetensors")) == {}
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        metrics = evaluate.main([str(folder)])
    assert metrics["perplexity"] == pytest.approx(rounds[-1]["val_perplexity"], rel=1e-6)
    assert out.getvalue().strip().splitlines()[-1].startswith("perplexity: ")


# ----------------------------------------------------------------------------- DSSRA inputs
def test_the_workload_counts_trainable_bytes_for_c7_and_the_uplink(data_dir, cache):
    """Under LoRA the blocks' trainable bytes are the adapters': gamma_0 (C7) keeps the frozen weights once but
    gradients and optimizer slots only for the adapters; the uplink (eq. 11) carries the adapters only."""
    workloads, models = {}, {}
    for lora in (True, False):
        model = models[lora] = _task(data_dir, cache, {"lora": {"enabled": lora, "r": 4}}).build_model(seed=0)
        mask = torch.ones(2, 12, dtype=torch.long)
        workloads[lora] = measure_workload(model.blocks, torch.randn(2, 12, 64), mask, head=model.head)
    lora, full = workloads[True], workloads[False]
    adapters = sum(
        p.numel() * 4 for n, p in models[True].blocks.named_parameters() if n.startswith("0.") and p.requires_grad
    )
    assert full.trainable_bytes == () and lora.param_bytes[0] == full.param_bytes[0] + adapters  # base + adapters
    assert lora.trainable_bytes[0] == adapters > 0 and lora.head_bytes == 0.0  # the LM head is frozen too
    assert lora.encoder_upload_bytes == sum(lora.trainable_bytes) and full.encoder_upload_bytes == full.encoder_bytes
    assert lora.encoder_upload_bytes * 10 < full.encoder_upload_bytes  # r = 4 on c_attn, c_proj of H = 64 blocks
    assert lora.uplink_bits() < full.uplink_bits()
    # gamma_0's weight part: all weights once, gradients + Adam's 2 slots for what trains
    assert lora.block_static_bytes() == max(lora.param_bytes) + 3 * adapters
    assert full.block_static_bytes() == 4 * max(full.param_bytes)
    assert lora.block_memory_bytes() < full.block_memory_bytes()
    assert Workload.from_dict(lora.to_dict()) == lora
    frozen = sum(lora.param_bytes) - sum(lora.trainable_bytes)  # what never travels
    assert replace(lora, trainable_bytes=()).uplink_bits() - lora.uplink_bits() == 8.0 * frozen
