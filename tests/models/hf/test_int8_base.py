"""``model.base_dtype: int8``: the TEBs' frozen base quantized by torchao (int8 weight-only), LoRA adapters fp32
on top (models/hf/int8_base.py), on the tiny Llama preset (nothing downloaded).

References independent of the code under test: the bytes of each tensor's storage (``untyped_storage().nbytes()``)
against the fp32 model's; the same model with plain fp32 ``nn.Linear`` layers holding torchao's dequantized weights,
run by torch's own autograd (the int8 layers must compute exactly that, forward and backward); the fp32 model
itself, trained the same steps (the int8 model's loss must follow it within the rounding int8 costs).
"""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.messages import pack_weights, unpack_weights
from collapipe_flwr.models.hf.int8_base import Int8BaseLinear, full_precision
from collapipe_flwr.models.hf.peft_export import base_state, merged_copy
from collapipe_flwr.pipeline.memory import SavedTensorMeter, param_bytes
from collapipe_flwr.system.workload import measure_workload
from collapipe_flwr.tasks import model_config
from tests.task_specs import specs

SPECIAL = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
VOCAB = 300


def build(base_dtype: str, seed: int = 0):
    """The tiny Llama split with LoRA (r = 4), its frozen base stored in ``base_dtype``; the same seed gives the
    same fp32 weights before quantization."""
    _, spec = specs("causal_lm", "llama_tiny", model_over={"base_dtype": base_dtype})
    torch.manual_seed(seed)
    return model_config.build_causal_lm(spec, VOCAB, SPECIAL)


def same_adapters(*splits) -> None:
    """Equal non-zero adapters in every split (peft starts lora_B at zero, which would hide the adapters' path)."""
    g = torch.Generator().manual_seed(5)
    params = [[p for p in s.blocks.parameters() if p.requires_grad] for s in splits]
    with torch.no_grad():
        for group in zip(*params):
            value = torch.randn(group[0].shape, generator=g) * 0.1
            for p in group:
                p.copy_(value)


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


def loss_of(split, ids, mask) -> torch.Tensor:
    x = split.embedding(ids)
    for block in split.blocks:
        x = block(x, mask)
    loss_sum, count = split.head.loss_terms(x, mask, {"input_ids": ids, "attention_mask": mask, "labels": ids})
    return loss_sum / count


def frozen(split) -> dict[str, torch.Tensor]:
    return {n: p for n, p in split.blocks.named_parameters() if not p.requires_grad}


def test_the_int8_base_holds_a_quarter_of_the_fp32_bytes_and_the_memory_counts_see_it():
    q, ref = build("int8"), build("fp32")
    layers = [m for m in q.blocks.modules() if isinstance(m, Int8BaseLinear)]
    assert len(layers) == 4 * 7  # q, k, v, o (peft's base_layer), gate, up, down per block
    assert {p.dtype for p in q.blocks.parameters() if p.requires_grad} == {torch.float32}  # adapters stay fp32
    stored = {n: p.untyped_storage().nbytes() for n, p in frozen(q).items()}
    full = {n: p.untyped_storage().nbytes() for n, p in frozen(ref).items()}
    # int8: 1 byte a weight + one fp32 scale per output row; the norms (a few vectors) stay fp32
    expected = sum(m.out_features * (m.in_features + 4) for m in layers)
    expected += sum(v for n, v in full.items() if "norm" in n)
    assert sum(stored.values()) == expected
    ratio = sum(stored.values()) / sum(full.values())
    assert 0.25 < ratio < 0.27  # a quarter, + 4 / in_features for the scales (in = 64 here; 576 in SmolLM2)
    # what the pipeline's memory report (C7's measured side) and DSSRA's workload count: the same bytes
    assert param_bytes(q.blocks) == sum(stored.values()) + sum(
        p.numel() * p.element_size() for p in q.blocks.parameters() if p.requires_grad
    )
    ids, mask = batch()
    work = measure_workload(q.blocks, q.embedding(ids).detach(), mask)
    assert sum(work.param_bytes) == param_bytes(q.blocks)


def test_the_int8_layers_compute_the_dequantized_fp32_model_forward_and_backward():
    q, plain = build("int8"), build("int8")
    plain.blocks = full_precision(plain.blocks)  # fp32 nn.Linear over torchao's dequantized weights
    assert not any(isinstance(m, Int8BaseLinear) for m in plain.blocks.modules())
    same_adapters(q, plain)
    ids, mask = batch()
    losses = [loss_of(s, ids, mask) for s in (q, plain)]
    for loss in losses:
        loss.backward()
    assert losses[0].item() == pytest.approx(losses[1].item(), rel=1e-6)
    reference = dict(plain.blocks.named_parameters())
    trained = [(n, a, reference[n]) for n, a in q.blocks.named_parameters() if a.requires_grad]
    assert len(trained) == 4 * 4 * 2
    for name, a, b in trained:
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_lora_step_moves_only_the_adapters_and_the_loss_tracks_the_fp32_base():
    """Five Adam steps on one batch. Only the adapters change (the int8 weights and scales stay bit for bit).
    Tolerance: per-row symmetric int8 rounds each weight by at most max|w_row| / 255 (about 0.4% of the row's
    largest weight, a far smaller share of a typical one), so the logits, and the loss of a model this size
    (about ln 300 = 5.7 at the start), move by well under 1%; a wrong scale or a lost row would move it by tens."""
    q, ref = build("int8"), build("fp32")
    same_adapters(q, ref)
    ids, mask = batch()
    before = {n: p.detach().clone() for n, p in frozen(q).items()}
    adapters = {n: p.detach().clone() for n, p in q.blocks.named_parameters() if p.requires_grad}
    curves = []
    for split in (q, ref):
        opt = torch.optim.Adam([p for p in split.blocks.parameters() if p.requires_grad], lr=1e-2)
        curve = []
        for _ in range(5):
            opt.zero_grad()
            loss = loss_of(split, ids, mask)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        curves.append(curve)
    for n, p in frozen(q).items():
        assert torch.equal(p, before[n]) and p.grad is None, n
    assert all(not torch.equal(p, adapters[n]) for n, p in q.blocks.named_parameters() if p.requires_grad)
    assert curves[0][-1] < curves[0][0]  # it learns
    assert curves[0] == pytest.approx(curves[1], rel=1e-2)


def test_the_int8_layers_keep_no_fp32_copy_of_a_weight_for_the_backward():
    """The saved tensors of a forward (parameters excluded) are no more than the fp32 base's: torchao's own
    ``F.linear`` on an ``Int8Tensor`` keeps each weight's fp32 copy, 4 bytes a weight, until the backward."""
    q, ref = build("int8"), build("fp32")
    ids, mask = batch()
    saved = []
    for split in (q, ref):
        x = split.embedding(ids).detach().requires_grad_(True)
        with SavedTensorMeter(exclude=list(split.blocks.parameters())) as meter:
            for block in split.blocks:
                x = block(x, mask)
        saved.append(meter.bytes)
    weights = sum(m.weight.numel() for m in q.blocks.modules() if isinstance(m, Int8BaseLinear))
    assert saved[0] <= saved[1] < saved[0] + 4 * weights


def test_the_download_carries_the_int8_base_exactly_and_the_export_merges_into_fp32():
    q = build("int8")
    same_adapters(q)
    parts = unpack_weights(pack_weights({"encoder": q.blocks.state_dict()}))
    assert {t.dtype for n, t in parts["encoder"].items() if n.endswith("base_layer.weight")} == {torch.int8}
    other = build("int8", seed=7)  # other weights until the download arrives
    other.blocks.load_state_dict(parts["encoder"])
    for name, value in other.blocks.state_dict().items():
        assert torch.equal(value, q.blocks.state_dict()[name]), name
    merged = merged_copy(q.blocks)  # peft's merge, on the dequantized base
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    assert any(isinstance(m, Int8BaseLinear) for m in q.blocks.modules())  # the model itself stays int8
    exported = base_state(q.embedding, q.blocks, q.head)  # the un-split model's weights, as the export writes them
    assert not any(t.dtype == torch.int8 or n.endswith("weight_scale") for n, t in exported.items())
    ids, mask = batch()
    with torch.no_grad():
        x = y = q.embedding(ids)
        for block, merged_block in zip(q.blocks, merged):
            x, y = block(x, mask), merged_block(y, mask)
    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "model,over,message",
    [
        ("llama_tiny", {"base_dtype": "int4"}, "model.base_dtype='int4' must be one of fp32, bf16, int8"),
        ("llama_tiny", {"base_dtype": "int8", "lora": {"enabled": False}}, "needs model.lora.enabled=true"),
        ("gpt2_tiny", {"base_dtype": "int8"}, "gpt2's are Conv1D; use bf16"),
    ],
)
def test_a_base_dtype_it_cannot_build_is_refused_in_one_line(model, over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as err:
        specs("causal_lm", model, model_over=over)
    assert "\n" not in str(err.value)


def test_no_torchao_is_refused_in_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError, match=r"collapipe-flwr\[quant\]") as err:
        specs("causal_lm", "llama_tiny", model_over={"base_dtype": "int8"})
    assert "\n" not in str(err.value)
