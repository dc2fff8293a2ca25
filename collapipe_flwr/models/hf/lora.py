"""LoRA on the device TEBs (and optionally the head) with ``peft``; the trainable state the uplink carries.

:func:`apply_lora` injects peft LoRA adapters (``peft.inject_adapter_in_model``, the same layers as
``get_peft_model`` would build on the whole model) into the attention projections of every TEB and
freezes every base weight: the embedding on the CU, the TEBs' own weights and, unless asked otherwise,
the head. Devices then train (and, later, upload) only the adapters theta^s_LoRA of their segment
delta_k; the pipeline builds its optimizers over trainable parameters only, so nothing else changes.

Adapter names keep the block numbering of ``blocks.state_dict()`` (``"{l}.layer...lora_A.default.weight"``),
so :func:`trainable_state_dict` of a segment goes through ``renumber_blocks`` / ``concat_segments`` (eq. (4))
like full weights do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.split import SplitModel

# The attention projections LoRA adapts, per model type (what peft's own defaults pick for these models).
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "bert": ("query", "key", "value"),
    "roberta": ("query", "key", "value"),
    "gpt2": ("c_attn", "c_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj"),
}
# GPT-2's Conv1D stores its weight as [in, out], the transpose of nn.Linear's
FAN_IN_FAN_OUT = frozenset({"gpt2"})


def lora_config(
    model_type: str, r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: Sequence[str] | None = None
) -> LoraConfig:
    """The LoraConfig for the TEBs of ``model_type`` (targets from :data:`TARGET_MODULES` unless given)."""
    if target_modules is None:
        if model_type not in TARGET_MODULES:
            raise ConfigError(f"no LoRA target modules known for model type {model_type!r}; pass target_modules")
        target_modules = TARGET_MODULES[model_type]
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        fan_in_fan_out=model_type in FAN_IN_FAN_OUT,
        bias="none",
    )


def freeze(module: nn.Module) -> None:
    for p in module.parameters():
        p.requires_grad_(False)


def apply_lora(
    split: SplitModel,
    config: LoraConfig | None = None,
    *,
    head_config: LoraConfig | None = None,
    train_head: bool = False,
) -> SplitModel:
    """LoRA adapters on every TEB (``config``; default :func:`lora_config` of the blocks' model type), base
    weights frozen. ``head_config``: adapters on the head too (e.g. ``target_modules=["lm_head"]``);
    ``train_head``: the head's own weights stay trainable (a freshly initialised classifier must be).
    Modifies ``split`` in place and returns it."""
    if config is None:
        config = lora_config(str(getattr(split.blocks[0], "model_type", "")))
    freeze(split.embedding)
    freeze(split.head)
    inject_adapter_in_model(config, split.blocks)  # freezes the blocks' base weights itself
    if head_config is not None:
        inject_adapter_in_model(head_config, split.head)
    if train_head:
        for p in split.head.parameters():
            p.requires_grad_(True)
    return split


def trainable_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters of ``module`` (under LoRA: the adapters), detached, by state-dict name."""
    return {name: p.detach() for name, p in module.named_parameters() if p.requires_grad}


def trainable_parameter_count(module: nn.Module) -> int:
    """Number of trainable scalars in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def trainable_bytes(module: nn.Module) -> int:
    """Bytes of the trainable parameters of ``module`` (what an adapter-only uplink carries, uncompressed)."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
