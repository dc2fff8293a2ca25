"""The Llama-style decoder family (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``) cut into
the paper's three modules.

- embedding (CU): ``model.embed_tokens`` (no position embedding: positions enter as rotations);
- L TEBs (devices): ``model.layers[l]``. Each block carries a reference to the model's ``rotary_emb`` (buffers
  only, no weights: nothing in the state dict, nothing for the uplink) and recomputes, as the original
  computes once before its first layer, position ids 0..T-1, the rotary (cos, sin) and the causal padding
  mask (sliding-window where the original's layer is: Mistral with ``sliding_window``, Qwen2's
  ``layer_types[l] == "sliding_attention"``); no cache;
- head (server): ``model.norm`` (RMSNorm) + ``lm_head`` (:class:`CausalLMHead`); a tied ``lm_head``
  (``tie_word_embeddings``) is untied into two equal copies (``tying.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from collapipe_flwr.models.hf.blocks import HFBlock, positions
from collapipe_flwr.models.hf.causal_lm_head import CausalLMHead
from collapipe_flwr.models.hf.masks import causal_mask
from collapipe_flwr.models.hf.tying import untied_copy


def is_sliding(config: Any, index: int) -> bool:
    """Whether layer ``index`` attends over a sliding window, by the rule of the original model type."""
    if config.model_type == "qwen2":
        return config.layer_types[index] == "sliding_attention"
    if config.model_type == "mistral":
        return getattr(config, "sliding_window", None) is not None
    return False


class TokenEmbedding(nn.Module):
    """CU part: the token embedding ``embed_tokens``."""

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class RotaryBlock(HFBlock):
    """One TEB: a decoder layer fed its rotary (cos, sin) and causal padding mask."""

    def __init__(self, layer: nn.Module, config: Any, index: int, rotary_emb: nn.Module) -> None:
        super().__init__(layer, config, index, config.intermediate_size)
        self.rotary_emb = rotary_emb

    def set_index(self, index: int) -> None:
        """Layer ``index``: also its mask kind and, in Qwen2's attention, its layer type and window."""
        super().set_index(index)
        self.sliding = is_sliding(self.config, index)
        if self.config.model_type == "qwen2":
            attention: Any = self.layer.self_attn
            attention.layer_type = self.config.layer_types[index]
            attention.sliding_window = self.config.sliding_window if self.sliding else None

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        position_ids = positions(hidden)
        mask = causal_mask(self.config, hidden, attention_mask, position_ids, sliding=self.sliding)
        cos_sin = self.rotary_emb(hidden, position_ids=position_ids)
        return self.layer(
            hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin, use_cache=False
        )


def cut_llama_style(model: nn.Module) -> tuple[nn.Module, list[nn.Module], CausalLMHead]:
    """(embedding, TEBs, head) of a ``*ForCausalLM`` of the family, reusing its modules."""
    base: Any = model.model
    config: Any = model.config
    lm_head: Any = model.lm_head
    blocks: list[nn.Module] = [RotaryBlock(layer, config, l, base.rotary_emb) for l, layer in enumerate(base.layers)]
    tied = lm_head.weight is base.embed_tokens.weight
    head = CausalLMHead(base.norm, untied_copy(lm_head) if tied else lm_head, tied)
    return TokenEmbedding(base.embed_tokens), blocks, head
