"""What every TEB cut from a Hugging Face model shares: the block call contract of ``models/split.py``.

A block is called ``block(hidden [B,T,H], attention_mask [B,T] long, 1 = real token) -> hidden [B,T,H]``,
exactly like the blocks of the ``transformer`` and ``bert`` families, so ``ClusterPipeline``, ``Stage`` and
the data plane move one tensor between segments delta_k and never learn the family. Whatever else the
original forward pass computes once before its first layer (position ids 0..T-1, the 4-D attention mask,
rotary cos/sin) is a pure function of (hidden's shape / dtype / device, attention_mask); every block
recomputes it with the original's own functions (see ``masks.py``), which gives bit-for-bit the same
inputs to each HF layer as the unsplit model, at a cost (O(T) for positions and cos/sin, O(B T^2) for
a mask) far below the block's own O(B T H^2).

TEBs are not always identical: Qwen2 can mix full and sliding-window layers, and HF layers keep their
index ``layer_idx``. The pipeline rebuilds a moved TEB from a copy of block 0 loaded with that block's state
dict (``pipeline/placement.py``), so what differs between layers travels in the state dict: the index l is
a persistent buffer ``layer_index`` (key ``"{l}.layer_index"``), and loading it re-derives every
index-dependent setting (:meth:`HFBlock.set_index`).

Blocks also name their sizes (``hidden_size``, ``ffn_size``, ``num_heads``; ``pipeline.memory.SizedBlock``)
so constraint C7's memory estimate covers them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def positions(hidden: torch.Tensor) -> torch.Tensor:
    """Position ids [1, T] = 0..T-1: what the HF models use in training (no cache, no explicit ids)."""
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


def _reindex_after_load(block: HFBlock, incompatible_keys: Any) -> None:
    """Load-state-dict post hook: a block loaded with block l's state becomes block l."""
    block.set_index(int(block.layer_index))


class HFBlock(nn.Module):
    """One TEB: the HF layer module ``layer`` (the very module of the loaded model, not a copy), its config
    and its index l in the stack; subclasses define ``forward(hidden, attention_mask)``."""

    layer_index: torch.Tensor  # l, a persistent long scalar buffer

    def __init__(self, layer: nn.Module, config: Any, index: int, ffn_size: int) -> None:
        super().__init__()
        self.layer = layer
        self.config = config
        self.hidden_size = int(config.hidden_size)
        self.ffn_size = int(ffn_size)
        self.num_heads = int(config.num_attention_heads)
        self.register_buffer("layer_index", torch.tensor(int(index)), persistent=True)
        self.register_load_state_dict_post_hook(_reindex_after_load)
        self.set_index(int(index))

    def set_index(self, index: int) -> None:
        """Make this block layer ``index``: the HF modules' ``layer_idx`` (subclasses add their own settings)."""
        self.index = int(index)
        for module in self.layer.modules():
            if hasattr(module, "layer_idx"):
                setattr(module, "layer_idx", self.index)  # noqa: B010 - nn.Module's __setattr__ is typed for tensors

    @property
    def model_type(self) -> str:
        return str(self.config.model_type)
