"""GPT-2 (``GPT2LMHeadModel``) cut into the paper's three modules.

- embedding (CU): ``wte(input_ids) + wpe(0..T-1)``, then ``drop``: ``GPT2Model.forward`` up to its first block;
- L TEBs (devices): ``transformer.h[l]``, each with the causal padding mask built as ``GPT2Model`` builds
  it (``masks.causal_mask``), no cache;
- head (server): ``ln_f`` + ``lm_head`` (:class:`CausalLMHead`); GPT-2 ties ``lm_head`` to ``wte``, which
  the split unties into two equal copies (``tying.py``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2LMHeadModel

from collapipe_flwr.errors import ConfigError, UnsupportedModelError
from collapipe_flwr.models.hf.blocks import HFBlock, positions
from collapipe_flwr.models.hf.causal_lm_head import CausalLMHead
from collapipe_flwr.models.hf.masks import causal_mask
from collapipe_flwr.models.hf.tying import untied_copy


class GPT2Embedding(nn.Module):
    """CU part: token + learned absolute position embeddings, dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.wte

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        T, max_len = input_ids.shape[1], self.wpe.num_embeddings
        if T > max_len:
            raise ConfigError(f"sequence length {T} exceeds the model's n_positions={max_len}; truncate the data")
        return self.drop(self.wte(input_ids) + self.wpe(positions(input_ids)))


class GPT2Block(HFBlock):
    """One TEB: a ``GPT2Block`` fed the causal padding mask of ``attention_mask``."""

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = positions(hidden)
        mask = causal_mask(self.config, hidden, attention_mask, position_ids, sliding=False)
        return self.layer(hidden, attention_mask=mask, position_ids=position_ids, use_cache=False)


def cut_gpt2(model: GPT2LMHeadModel) -> tuple[nn.Module, list[nn.Module], CausalLMHead]:
    """(embedding, TEBs, head) of ``model``, reusing its modules (no copy but the untied head weight)."""
    base, config = model.transformer, model.config
    if config.scale_attn_by_inverse_layer_idx:
        raise UnsupportedModelError(
            "gpt2 with scale_attn_by_inverse_layer_idx=True is not supported: its attention scale is fixed per layer "
            "when built, so a block moved between devices could not become another layer; load it with False"
        )
    ffn = config.n_inner or 4 * config.hidden_size
    blocks: list[nn.Module] = [GPT2Block(layer, config, l, ffn) for l, layer in enumerate(base.h)]
    tied = model.lm_head.weight is base.wte.weight
    lm_head = untied_copy(model.lm_head) if tied else model.lm_head
    return GPT2Embedding(base.wte, base.wpe, base.drop), blocks, CausalLMHead(base.ln_f, lm_head, tied)
