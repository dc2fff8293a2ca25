"""Key/value cache for incremental (greedy) decoding through a stack of pre-LN ``nn.TransformerDecoderLayer``s.

At decoding step t the last position's output needs, per layer, the self-attention keys and values of positions
0..t and the cross-attention keys and values of the source (the server's memory z^enc after its LayerNorm). The
source's are projected once per batch; each step projects only the new position's query, key and value and
appends them, so a step costs O(t + T_src) attention and O(1) projections instead of re-projecting the prefix
and the source.

Written by hand because ``nn.MultiheadAttention`` keeps no cache: given the prefix and the memory it re-projects
every key and value at every step (in the translation head this was half the evaluation time). The maths is the
layer's own: its packed ``in_proj_weight`` / ``in_proj_bias`` split into query, key and value, scaled dot-product
attention per head (``F.scaled_dot_product_attention``, scale 1/sqrt(d_head) as in ``nn.MultiheadAttention``) and
its ``out_proj``. Eval mode only: attention dropout is not applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F


def _projection(attn: nn.MultiheadAttention, x: torch.Tensor, part: int) -> torch.Tensor:
    """x W_part^T + b_part for part 0 (query), 1 (key) or 2 (value) of the packed in-projection."""
    if attn.in_proj_weight is None:
        raise ValueError("decoder_cache needs nn.MultiheadAttention with one packed in_proj_weight (kdim = vdim = d)")
    d = attn.embed_dim
    weight = attn.in_proj_weight[part * d : (part + 1) * d]
    bias = None if attn.in_proj_bias is None else attn.in_proj_bias[part * d : (part + 1) * d]
    return F.linear(x, weight, bias)


def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B,T,d] -> [B,H,T,d/H]."""
    B, T, d = x.shape
    return x.view(B, T, num_heads, d // num_heads).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """[B,H,T,d/H] -> [B,T,d]."""
    B, H, T, dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * dh)


@dataclass
class _LayerCache:
    cross_k: torch.Tensor  # [B,H,T_src,dh]
    cross_v: torch.Tensor
    self_k: torch.Tensor | None = None  # [B,H,t,dh], grows by one position per step
    self_v: torch.Tensor | None = None


class DecoderCache:
    """The cache of one batch: built from the normalised memory [B,T_src,d] and its key padding mask [B,T_src]
    (True = padding); :meth:`step` runs one new position [B,1,d] through the layers."""

    def __init__(self, layers: Iterable[nn.Module], memory: torch.Tensor, memory_pad: torch.Tensor) -> None:
        self.layers = [cast(nn.TransformerDecoderLayer, layer) for layer in layers]
        self.length = 0
        self.cross_mask = ~memory_pad[:, None, None, :]  # SDPA's boolean mask: True = attend
        self.caches = []
        for layer in self.layers:
            attn, H = layer.multihead_attn, layer.multihead_attn.num_heads
            k = _heads(_projection(attn, memory, 1), H)
            v = _heads(_projection(attn, memory, 2), H)
            self.caches.append(_LayerCache(cross_k=k, cross_v=v))

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """The decoder stack's output [B,1,d] at position ``self.length`` for input x [B,1,d] (before the
        stack's final norm), the same as the layers' pre-LN forward restricted to the last position."""
        for layer, cache in zip(self.layers, self.caches):
            x = x + self._self_attention(layer.self_attn, layer.norm1(x), cache)
            x = x + self._cross_attention(layer.multihead_attn, layer.norm2(x), cache)
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))
        self.length += 1
        return x

    def _self_attention(self, attn: nn.MultiheadAttention, h: torch.Tensor, cache: _LayerCache) -> torch.Tensor:
        H = attn.num_heads
        q, k, v = (_heads(_projection(attn, h, part), H) for part in range(3))
        cache.self_k = k if cache.self_k is None else torch.cat([cache.self_k, k], dim=2)
        cache.self_v = v if cache.self_v is None else torch.cat([cache.self_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, cache.self_k.to(q.dtype), cache.self_v.to(q.dtype))  # causal: only 0..t
        return attn.out_proj(_merge(out))

    def _cross_attention(self, attn: nn.MultiheadAttention, h: torch.Tensor, cache: _LayerCache) -> torch.Tensor:
        q = _heads(_projection(attn, h, 0), attn.num_heads)
        out = F.scaled_dot_product_attention(
            q, cache.cross_k.to(q.dtype), cache.cross_v.to(q.dtype), attn_mask=self.cross_mask
        )
        return attn.out_proj(_merge(out))
