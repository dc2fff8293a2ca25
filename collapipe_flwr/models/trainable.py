"""What travels when only part of the model trains (``model.lora.enabled``: the adapters theta^s_LoRA of every
segment delta_k, models/hf/lora.py): the trainable tensors of each part, never the frozen base weights.

Parts are the state dicts of :data:`~collapipe_flwr.models.split.PARTS` (``{"embedding": sd, "encoder": sd,
"head": sd}``). :func:`only_trainable` keeps, per part, the tensors of parameters with ``requires_grad`` (a part
with none is left out: nothing of it trains, nothing of it travels); :func:`with_frozen` puts back the
frozen tensors a receiver already holds (its own copy of the base weights: every party builds the same
base from the same folder or config and seed, and a CU's first download carries them once).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

Parts = dict[str, dict[str, torch.Tensor]]


def trainable_names(module: nn.Module) -> frozenset[str]:
    """State-dict names of ``module``'s trainable parameters (under LoRA: the adapters)."""
    return frozenset(name for name, p in module.named_parameters() if p.requires_grad)


def only_trainable(parts: Mapping[str, Mapping[str, torch.Tensor]], modules: Mapping[str, nn.Module]) -> Parts:
    """``parts`` cut to the trainable tensors of ``modules`` (same part names); parts with none are left out."""
    out: Parts = {}
    for part, state in parts.items():
        names = trainable_names(modules[part])
        kept = {name: value for name, value in state.items() if name in names}
        if kept:
            out[part] = kept
    return out


def with_frozen(parts: Mapping[str, Mapping[str, torch.Tensor]], modules: Mapping[str, nn.Module]) -> Parts:
    """Each part of ``modules`` as a whole state dict: the tensors in ``parts`` over the module's own ones."""
    return {part: {**module.state_dict(), **dict(parts.get(part, {}))} for part, module in modules.items()}


def tensor_bytes(parts: Mapping[str, Mapping[str, torch.Tensor]]) -> int:
    """Bytes of every tensor in ``parts`` (what a message of them carries, uncompressed)."""
    return sum(t.numel() * t.element_size() for state in parts.values() for t in state.values())
