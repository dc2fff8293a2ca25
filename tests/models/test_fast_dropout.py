"""models/fast_dropout.py: a dropout with torch's distribution and gradient, checked against the Bernoulli law,
numerical differentiation and torch's own module, not against its own output."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torch import nn

from collapipe_flwr.models.fast_dropout import FastDropout, attention, fast_dropout, keep_mask, use_fast_dropout
from collapipe_flwr.models.transformer import TransformerConfig, build_transformer

N = 1 << 20


def _sigmas(observed: float, expected: float, n: int) -> float:
    """How many binomial standard deviations ``observed`` (a frequency over n trials) is from ``expected``."""
    return abs(observed - expected) / math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_element_is_kept_with_probability_one_minus_p_and_neighbours_independently(p):
    torch.manual_seed(0)
    keep, scale = keep_mask(torch.Size([N]), p)
    q = 1 - p
    assert _sigmas(keep.float().mean().item(), q, N) < 6
    assert scale == pytest.approx(1 / q, rel=1e-4)  # p rounded to 2**-16 at most
    k = keep.float()
    for lag in (1, 2, 3, 4, 5):  # lanes of one 64-bit draw (1-3) and of the next draws (4, 5)
        both = (k[:-lag] * k[lag:]).mean().item()
        assert _sigmas(both, q * q, N - lag) < 6, lag


def test_the_output_keeps_the_input_in_expectation_and_zeroes_the_rest():
    torch.manual_seed(1)
    x = torch.full((N,), 2.0)
    out = fast_dropout(x, 0.2)
    kept = out != 0
    assert torch.allclose(out[kept], torch.full_like(out[kept], 2.0 / 0.8), rtol=1e-4)
    assert out.mean().item() == pytest.approx(2.0, abs=6 * 2.0 / 0.8 * math.sqrt(0.2 * 0.8 / N))


def test_the_gradient_matches_numerical_differentiation():
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)

    def seeded(t):
        torch.manual_seed(7)  # the same mask on every call gradcheck makes
        return fast_dropout(t, 0.4)

    assert torch.autograd.gradcheck(seeded, (x,))


def test_the_seed_fixes_the_masks_as_it_fixes_torchs():
    x = torch.ones(1000)
    torch.manual_seed(3)
    a = fast_dropout(x, 0.5)
    torch.manual_seed(3)
    b = fast_dropout(x, 0.5)
    torch.manual_seed(4)
    c = fast_dropout(x, 0.5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_eval_mode_and_p_zero_return_the_input_and_p_one_zeroes_it():
    x = torch.randn(4, 6)
    assert fast_dropout(x, 0.5, training=False) is x
    assert fast_dropout(x, 0.0) is x
    assert torch.equal(fast_dropout(x, 1.0), torch.zeros_like(x))
    module = FastDropout(0.5).eval()
    assert module(x) is x
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        keep_mask(x.shape, 1.0)


def test_odd_sizes_and_bf16_keep_their_shape_and_dtype():
    x = torch.randn(3, 5, 7).to(torch.bfloat16)  # 105 elements: not a multiple of four lanes
    out = fast_dropout(x, 0.3)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    scale = keep_mask(x.shape, 0.3)[1]
    assert torch.all((out == 0) | (out == (x.float() * scale).to(torch.bfloat16)))


def test_every_torch_dropout_of_a_model_is_swapped_with_its_p_and_mode():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.25, batch_first=True)
    layer.dropout1.eval()
    before = {name: (m.p, m.training) for name, m in layer.named_modules() if type(m) is nn.Dropout}
    assert use_fast_dropout(layer) == len(before) == 3
    after = {name: (m.p, m.training) for name, m in layer.named_modules() if isinstance(m, FastDropout)}
    assert after == before
    assert not any(type(m) is nn.Dropout for m in layer.modules())


def test_the_models_builders_return_fast_dropout_everywhere_and_it_survives_pickling():
    """The translation model (CU embedding, device blocks, server decoder) holds no torch nn.Dropout; a block
    travels pickled to a device actor and still drops there."""
    config = TransformerConfig(
        src_vocab=50, tgt_vocab=50, d_model=16, n_heads=2, d_ff=32, enc_layers=2, dec_layers=1, dropout=0.3,
        max_len=16, pad_id=0, label_smoothing=0.0, tie_embeddings=True,
    )  # fmt: skip
    model = build_transformer(config)
    modules = [m for part in model.parts() for m in part.modules()]
    assert not any(type(m) is nn.Dropout for m in modules)
    assert sum(isinstance(m, FastDropout) for m in modules) >= 3 * 2 + 1
    block = pickle.loads(pickle.dumps(model.blocks[0])).train()
    hidden = torch.ones(4, 8, 16)
    torch.manual_seed(0)
    out = block(hidden, torch.ones(4, 8, dtype=torch.long))
    torch.manual_seed(1)
    assert not torch.equal(out, block(hidden, torch.ones(4, 8, dtype=torch.long)))


def test_the_attention_function_computes_sdpa_with_the_padding_mask():
    """BERT's blocks' attention (``fast_dropout.attention``): its own arithmetic, taken in training with a dropout
    too small to drop anything (p < 2**-17 keeps every element), equals torch's scaled_dot_product_attention on the
    same additive padding mask; in eval it is sdpa itself."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 5)
    mask[1, ..., 3:] = torch.finfo(torch.float32).min  # the second sequence's last two tokens are padding
    expected = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    module = nn.Module().train()
    module.is_causal = False  # as BertSelfAttention (transformers' sdpa function reads it)
    out, probs = attention(module, q, k, v, mask, dropout=1e-9)
    assert torch.allclose(out, expected, atol=1e-6)
    assert probs is not None and torch.all(probs[1, ..., 3:] == 0)
    out_eval, _ = attention(module.eval(), q, k, v, mask, dropout=0.3)
    assert torch.allclose(out_eval, expected, atol=1e-6)


def test_the_torch_kernel_puts_every_dropout_and_the_attention_back_on_torchs():
    """``model.dropout_kernel: torch`` (a config's way to repeat a run made before this module): a BERT built
    through the task's builder holds torch's nn.Dropout with each module's p and mode, and its attention is
    transformers' sdpa again (whose kernel draws the probabilities' mask); the fast kernel is the default.
    The golden fixed-seed run (tests/fl/server/test_fixed_seed_run.py) checks the translation model's masks bit
    for bit."""
    from collapipe_flwr.models.fast_dropout import ATTENTION, with_dropout_kernel
    from collapipe_flwr.tasks.model_config import build_bert_model
    from collapipe_flwr.tasks.spec import ModelSpec

    sizes = {"hidden": 16, "n_heads": 2, "d_ff": 32, "layers": 2}
    fast = build_bert_model(ModelSpec(family="bert", sizes=sizes, dropout=0.2, max_len=16), 30, "sequence", 3)
    fast.blocks[1].eval()
    before = {name: (m.p, m.training) for name, m in fast.blocks.named_modules() if isinstance(m, FastDropout)}
    assert before and {m.config._attn_implementation for m in fast.blocks.modules() if hasattr(m, "config")} == {
        ATTENTION
    }
    plain = with_dropout_kernel(fast, "torch")
    modules = [m for part in plain.parts() for m in part.modules()]
    assert not any(isinstance(m, FastDropout) for m in modules)
    after = {name: (m.p, m.training) for name, m in plain.blocks.named_modules() if type(m) is nn.Dropout}
    assert after == before
    assert {m.config._attn_implementation for m in modules if hasattr(m, "config")} == {"sdpa"}
    spec = ModelSpec(family="bert", sizes=sizes, dropout=0.2, max_len=16, dropout_kernel="torch")
    built = build_bert_model(spec, 30, "sequence", 3)
    assert not any(isinstance(m, FastDropout) for part in built.parts() for m in part.modules())


def test_an_unknown_dropout_kernel_is_refused_with_the_valid_ones():
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.dropout_kernel='philox' must be one of fast, torch"):
        load_run_config(["model.dropout_kernel=philox"])
    assert load_run_config(["model.dropout_kernel=torch"]).model.dropout_kernel == "torch"
    assert load_run_config([]).model.dropout_kernel == "fast"
