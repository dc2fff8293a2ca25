"""models/hf: a Hugging Face model cut into embedding (CU) | L TEBs in segments delta_k (devices) | head (server)
computes what the un-split model computes: the same loss and the same gradient for every parameter (padding in
the batch), the same SGD steps through the real ClusterPipeline across a re-partition, the same with LoRA
against peft on the un-split model; and an architecture it cannot cut is one line naming what is missing.

Tiny random configs (4 layers, hidden 32, vocab 100), fp32, dropout 0, seeded."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import inject_adapter_in_model
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    RobertaConfig,
    T5Config,
)

from collapipe_flwr.errors import ConfigError, UnsupportedModelError
from collapipe_flwr.models.hf import (
    apply_lora,
    load_hf_model,
    load_split,
    lora_config,
    split_hf_model,
    sync_tied_gradients,
    tied_pairs,
    trainable_bytes,
    trainable_parameter_count,
    trainable_state_dict,
)
from collapipe_flwr.models.split import concat_segments, renumber_blocks, segment_bounds
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.memory import SizedBlock
from collapipe_flwr.pipeline.optim import OptimizerSpec
from tests.segment_chain import chain_backward, segments_forward

ARCHS = ("bert", "roberta", "gpt2", "llama", "qwen2", "mistral")
V, H, L, B, T = 100, 32, 4, 4, 9
TOL = {"rtol": 1e-5, "atol": 1e-5}
LR = 0.5
DECODER = {"vocab_size": V, "hidden_size": H, "intermediate_size": 64, "num_hidden_layers": L}
DECODER_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
ENCODER = {
    "vocab_size": V,
    "hidden_size": H,
    "num_hidden_layers": L,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "num_labels": 3,
}


def make_config(arch: str, tied: bool | None = None):
    """(config, task) of a tiny ``arch``; ``tied`` overrides tie_word_embeddings (gpt2 ties by default)."""
    tie = {} if tied is None else {"tie_word_embeddings": tied}
    if arch == "gpt2":
        gpt2 = {"n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        sizes = {"vocab_size": V, "n_embd": H, "n_layer": L, "n_head": 4, "bos_token_id": 1, "eos_token_id": 2}
        return GPT2Config(**sizes, **gpt2, **tie), "causal_lm"
    if arch == "llama":
        return LlamaConfig(**DECODER, **DECODER_HEADS, **tie), "causal_lm"
    if arch == "qwen2":  # layers 2 and 3 attend over a sliding window of 4 (< T), layers 0 and 1 fully
        window = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}
        return Qwen2Config(**DECODER, **DECODER_HEADS, **window, **tie), "causal_lm"
    if arch == "mistral":
        return MistralConfig(**DECODER, **DECODER_HEADS, sliding_window=4, **tie), "causal_lm"
    if arch == "bert":
        return BertConfig(**ENCODER), "sequence_classification"
    return RobertaConfig(**ENCODER), "token_classification"


def build(arch: str, tied: bool | None = None, seed: int = 0):
    """(model to split, an untouched deep copy of it, task)."""
    config, task = make_config(arch, tied)
    torch.manual_seed(seed)
    model = load_hf_model(config, task)
    model.train()
    return model, copy.deepcopy(model), task


def make_batch(task: str, seed: int) -> dict[str, torch.Tensor]:
    """B sentences of T tokens, three of them right-padded."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, V, (B, T), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row, length in ((1, 7), (2, 4), (3, 8)):
        attention_mask[row, length:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    if task == "causal_lm":
        labels = input_ids.masked_fill(attention_mask == 0, -100)
    elif task == "sequence_classification":
        labels = torch.randint(0, 3, (B,), generator=g)
    else:
        labels = torch.randint(0, 3, (B, T), generator=g).masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def segmented_backward(split, batch, delta) -> float:
    """embedding -> the segments of ``delta`` (each from a detached leaf, as pipeline stages) -> head; backward
    through the same chain; returns the loss."""
    embedded, z_enc, chain = segments_forward(split, batch, delta)
    loss_sum, count = split.head.loss_terms(z_enc, batch["attention_mask"], batch)
    loss = loss_sum / count
    loss.backward()
    grad = chain_backward(z_enc, chain)
    if embedded.requires_grad:
        embedded.backward(grad)
    return loss.item()


def assert_grads_match(model, ref, split) -> None:
    """Every parameter's gradient in the split equals the un-split ``ref``'s (a tied matrix: the sum of its two
    copies'); frozen ones have none on either side. ``model`` is the model ``split`` was cut from."""
    names = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    partner = {id(a): b for a, b in tied_pairs(split)}
    head_copies = {id(b) for _, b in tied_pairs(split)}
    checked = set()
    for p in split.parameters():
        if id(p) in head_copies:
            continue
        name = names[id(p)]
        expected, got = ref_params[name].grad, p.grad
        if id(p) in partner and partner[id(p)].grad is not None:
            got = partner[id(p)].grad + (0 if got is None else got)
        if expected is None:
            assert got is None, name
        else:
            torch.testing.assert_close(got, expected, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        checked.add(name)
    assert checked == set(ref_params)


CASES = [*((a, None) for a in ARCHS), ("llama", True)]
CASE_IDS = [a if tied is None else f"{a}-tied" for a, tied in CASES]


@pytest.mark.parametrize("arch,tied", CASES, ids=CASE_IDS)
def test_split_loss_and_every_gradient_equal_the_unsplit_model(arch, tied):
    model, ref, task = build(arch, tied)
    split = split_hf_model(model)
    assert split.family == "hf" and split.num_blocks == L
    assert all(isinstance(block, SizedBlock) for block in split.blocks)
    assert bool(tied_pairs(split)) == (arch == "gpt2" or bool(tied))
    batch = make_batch(task, seed=1)
    expected = ref(**batch).loss
    expected.backward()
    loss = segmented_backward(split, batch, (1, 0, 2, 1))
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert_grads_match(model, ref, split)


def reference_steps(ref, batches) -> list[float]:
    """Plain SGD steps of the un-split model on ``batches``; the loss before each step."""
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR)
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = ref(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def assert_weights_match(model, ref, split, encoder_state) -> None:
    """The split's weights (blocks from the pipeline's ``encoder_state``, keys ``"{l}.{param}"``) equal ``ref``'s."""
    names = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    for key, p in split.blocks.named_parameters():
        torch.testing.assert_close(encoder_state[key], ref_params[names[id(p)]].detach(), **TOL)
    head_copies = {id(b): a for a, b in tied_pairs(split)}
    for part in (split.embedding, split.head):
        for p in part.parameters():
            name = names[id(head_copies.get(id(p), p))]
            torch.testing.assert_close(p.detach(), ref_params[name].detach(), **TOL, msg=name)


def pipeline_steps(split, batches, deltas) -> tuple[list[float], dict[str, torch.Tensor]]:
    """SGD steps of ``split`` through ClusterPipeline (m = 2) + LocalHead, re-partitioned to deltas[i] before
    step i; the step losses and the final encoder state."""
    sgd = OptimizerSpec(name="sgd", lr=LR)
    pipe = ClusterPipeline(split.embedding, split.blocks, deltas[0], sgd)
    try:
        head, losses = LocalHead(split.head, sgd), []
        for batch, delta in zip(batches, deltas):
            pipe.placement.repartition(delta)
            losses.append(pipe.train_step(batch, 2, head).loss)
        return losses, pipe.encoder_state_dict()
    finally:
        pipe.shutdown()


@pytest.mark.parametrize("arch", ARCHS)
def test_pipeline_steps_across_a_repartition_equal_the_unsplit_model(arch):
    """Through the unchanged ClusterPipeline: delta (1,3), an SGD step, re-partition to (2,2), another step.
    (Untied weights: the pipeline has no step between backward and update to sum a tied matrix's gradients.)"""
    model, ref, task = build(arch, tied=False)
    split = split_hf_model(model)
    batches = [make_batch(task, seed=s) for s in (1, 2)]
    losses, encoder = pipeline_steps(split, batches, [(1, 3), (2, 2)])
    assert losses == pytest.approx(reference_steps(ref, batches), rel=1e-5)
    assert_weights_match(model, ref, split, encoder)


@pytest.mark.parametrize("arch,tied", [("gpt2", None), ("llama", True)], ids=["gpt2", "llama-tied"])
def test_tied_embeddings_step_like_the_tied_original_with_gradient_sync(arch, tied):
    model, ref, task = build(arch, tied)
    split = split_hf_model(model)
    batches = [make_batch(task, seed=s) for s in (1, 2)]
    opt = torch.optim.SGD(list(split.parameters()), lr=LR)
    losses = []
    for batch, delta in zip(batches, [(1, 3), (2, 2)]):
        opt.zero_grad()
        losses.append(segmented_backward(split, batch, delta))
        sync_tied_gradients(split)
        opt.step()
    assert losses == pytest.approx(reference_steps(ref, batches), rel=1e-5)
    ((emb, head),) = tied_pairs(split)
    assert torch.equal(emb, head)
    assert_weights_match(model, ref, split, split.blocks.state_dict())


def lora_pair(arch: str):
    """(model cut into a LoRA'd split, its split, peft's LoRA on the un-split copy, task) with equal, non-zero
    adapters; a classifier head stays fully trainable on both sides."""
    model, ref, task = build(arch)
    split = apply_lora(split_hf_model(model), train_head=task != "causal_lm")
    inject_adapter_in_model(lora_config(arch), ref)
    names = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    torch.manual_seed(3)
    with torch.no_grad():
        for p in split.parameters():
            if p.requires_grad:
                target = ref_params[names[id(p)]]
                target.requires_grad_(True)
                if "lora_" in names[id(p)]:
                    target.normal_(0.0, 0.2)
                p.copy_(target)
    return model, split, ref, task


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_split_equals_peft_on_the_unsplit_model(arch):
    model, split, ref, task = lora_pair(arch)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [n for n, p in ref.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in trainable) and not any("embed" in n or "wte" in n for n in trainable)
    batch = make_batch(task, seed=1)
    expected = ref(**batch).loss
    expected.backward()
    assert segmented_backward(split, batch, (2, 1, 1)) == pytest.approx(expected.item(), rel=1e-6)
    assert_grads_match(model, ref, split)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert"])
def test_lora_pipeline_steps_across_a_repartition_equal_peft(arch):
    """Frozen base weights keep a tied matrix's copies equal, so tied GPT-2 trains through the pipeline too."""
    model, split, ref, task = lora_pair(arch)
    for p in ref.parameters():
        p.grad = None
    batches = [make_batch(task, seed=s) for s in (1, 2)]
    losses, encoder = pipeline_steps(split, batches, [(3, 1), (1, 3)])
    assert losses == pytest.approx(reference_steps(ref, batches), rel=1e-5)
    assert_weights_match(model, ref, split, encoder)


def test_trainable_state_is_the_adapters_and_concatenates_like_the_encoder():
    split = apply_lora(split_hf_model(build("gpt2")[0]))
    adapters = trainable_state_dict(split.blocks)
    assert adapters and all("lora_" in k for k in adapters)
    # r=8 adapters on c_attn (32 -> 96) and two c_proj per block: A r x in, B out x r
    per_block = 8 * (32 + 96) + 8 * (32 + 32) + 8 * (128 + 32)
    assert trainable_parameter_count(split.blocks) == L * per_block
    assert trainable_bytes(split.blocks) == 4 * L * per_block
    assert trainable_parameter_count(split.embedding) == trainable_parameter_count(split.head) == 0
    delta = (1, 3)
    segments = [renumber_blocks(adapters, -a, range(a, b)) for _, a, b in segment_bounds(delta)]
    assert concat_segments(segments, delta).keys() == adapters.keys()


def test_unsupported_architectures_are_one_line_errors():
    with pytest.raises(UnsupportedModelError) as err:
        load_hf_model(T5Config(vocab_size=V, d_model=H, num_layers=1, num_heads=2, d_ff=64), "causal_lm")
    message = str(err.value)
    assert "'t5' is not supported" in message and "supported: bert, roberta, gpt2, llama, qwen2, mistral" in message
    assert "\n" not in message
    with pytest.raises(UnsupportedModelError, match="GPT2ForSequenceClassification is not supported.*GPT2LMHeadModel"):
        split_hf_model(GPT2ForSequenceClassification(make_config("gpt2")[0]))
    with pytest.raises(UnsupportedModelError, match="BertModel is not supported"):
        split_hf_model(BertModel(make_config("bert")[0]))
    with pytest.raises(UnsupportedModelError, match="cross-attention"):
        load_hf_model(GPT2Config(n_embd=H, n_layer=1, n_head=2, add_cross_attention=True))


def test_loads_from_a_local_folder_only_unless_the_hub_is_allowed(tmp_path):
    model, ref, task = build("llama")
    model.save_pretrained(tmp_path)
    split = load_split(tmp_path, task)
    batch = make_batch(task, seed=1)
    z = split.embedding(batch["input_ids"])
    for block in split.blocks:
        z = block(z, batch["attention_mask"])
    loss_sum, count = split.head.loss_terms(z, batch["attention_mask"], batch)
    assert (loss_sum / count).item() == pytest.approx(ref(**batch).loss.item(), rel=1e-6)
    with pytest.raises(ConfigError, match="not a local folder.*allow_hub=True"):
        load_hf_model(tmp_path / "missing", task)
    with pytest.raises(ConfigError, match="task 'masked_lm' is not one of"):
        load_hf_model(tmp_path, "masked_lm")


def test_a_block_rebuilt_from_block_0_becomes_the_layer_whose_state_it_loads():
    """The pipeline rebuilds a moved TEB as a copy of block 0 loaded with block l's state dict: the index travels
    as the ``layer_index`` buffer and re-derives Qwen2's sliding-window layer type."""
    split = split_hf_model(build("qwen2")[0])
    rebuilt = copy.deepcopy(split.blocks[0])
    assert not rebuilt.sliding
    rebuilt.load_state_dict(split.blocks[3].state_dict())
    attention = rebuilt.layer.self_attn
    assert (rebuilt.index, rebuilt.sliding, attention.layer_idx, attention.sliding_window) == (3, True, 3, 4)
