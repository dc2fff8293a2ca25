"""Dropout whose mask costs a quarter of torch's random draws on the CPU.

On the CPU, ``F.dropout`` draws one Bernoulli value per element (``bernoulli_``, serial calls into torch's Mersenne
Twister), then divides and multiplies the mask in: ``benchmarks/dropout_share.py`` measured 23-29% of the
embedding-and-encoder step of the three tasks' default models spent in dropout (torch's open issue #138199). Here
one 64-bit draw (``random_`` over the full int64 range, the same generator) gives four independent 16-bit uniforms
u, and an element is kept when u >= round(p * 2**16): the keep probability is 1 - p with p rounded to a multiple of
2**-16 (an error below 8e-6), and kept elements are scaled by the inverse of that probability, so the output's
expectation is the input, as torch's. The mask is saved for the backward as one byte per element (torch saves a
float mask) and the gradient is the output's times the same mask and scale.

Each element's draw comes from torch's default generator, so ``torch.manual_seed`` fixes the masks as
it fixes torch's (``runtime.seeded_dropout`` seeds each block before it runs). Off the CPU, torch's own fused kernel
(Philox, in parallel) is already fast and is used unchanged; in eval mode, or with p = 0, the input is returned.

Hand-written because no kept library offers a cheaper CPU dropout; :func:`use_fast_dropout` swaps every
``nn.Dropout`` of a model for :class:`FastDropout` (same p), the way peft swaps layers for its adapters, and
:func:`attention` is a transformers attention function (registered through ``AttentionInterface``, the library's
way to add one) that draws the attention probabilities' mask the same way for BERT's blocks. Dropout that a module
applies without either (``nn.MultiheadAttention``'s attention probabilities: the translation model's) keeps
torch's kernel. ``model.dropout_kernel: torch`` (:func:`with_dropout_kernel`) puts a built model back on torch's
kernels everywhere, to repeat a run made before this module.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, cast

import torch
from torch import nn

from collapipe_flwr.models.split import SplitModel

LEVELS = 1 << 16  # 16-bit uniforms
_LANES = 4  # 16-bit uniforms per 64-bit draw
_INT64_MIN = -(1 << 63)


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> tuple[torch.Tensor, float]:
    """(bool mask of ``shape``, each element True with probability 1 - p, p rounded to a multiple of 2**-16; the
    scale 1 / that probability). Four elements per 64-bit draw of torch's default generator."""
    threshold = round(float(p) * LEVELS)
    if not 0 <= threshold < LEVELS:
        raise ValueError(f"dropout probability {p} must be in [0, 1)")
    numel = shape.numel()
    draws = torch.empty((numel + _LANES - 1) // _LANES, dtype=torch.int64, device=device)
    draws.random_(_INT64_MIN, None)  # every bit uniform (full int64 range)
    lanes = draws.view(torch.int16)[:numel].view(shape)  # signed: lane + 2**15 is uniform on 0 .. 2**16 - 1
    return lanes >= threshold - LEVELS // 2, LEVELS / (LEVELS - threshold)


class _MaskedScale(torch.autograd.Function):
    """out = x * keep * scale; the backward scales the gradient by the same mask (keep saved as bool)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None, None


def fast_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the cheaper CPU mask above (torch's own kernel off the CPU)."""
    if not training or p == 0.0 or x.numel() == 0:
        return x
    if x.device.type != "cpu" or round(p * LEVELS) >= LEVELS:  # p within 2**-17 of 1: every element dropped
        return nn.functional.dropout(x, p, training)
    keep, scale = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, keep, scale)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` (same p, same state) whose CPU mask is drawn by :func:`keep_mask`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Dropout's name
        return fast_dropout(input, self.p, self.training)


def _swap(module: nn.Module, match: Callable[[nn.Module], bool], make: Callable[[nn.Module], nn.Module]) -> int:
    """Replace every child module inside ``module`` for which ``match`` holds by ``make(child)``, in the child's
    train / eval mode; returns how many were replaced."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if match(child):
                setattr(parent, name, make(child).train(child.training))
                swapped += 1
    return swapped


def use_fast_dropout(module: nn.Module) -> int:
    """Swap every ``nn.Dropout`` (the class itself, not subclasses) inside ``module`` for a :class:`FastDropout`
    with the same p; returns how many were swapped."""
    return _swap(module, lambda child: type(child) is nn.Dropout, lambda child: FastDropout(cast(nn.Dropout, child).p))


def use_torch_dropout(module: nn.Module) -> int:
    """The inverse of :func:`use_fast_dropout` and of :func:`attention`: every :class:`FastDropout` inside
    ``module`` swapped back for torch's ``nn.Dropout`` (same p and mode), and every attention whose config names
    :data:`ATTENTION` put back on transformers' ``sdpa`` (torch's kernel then draws the attention probabilities'
    mask); returns how many dropout modules were swapped."""
    swapped = _swap(
        module, lambda child: isinstance(child, FastDropout), lambda child: nn.Dropout(cast(FastDropout, child).p)
    )
    for part in module.modules():
        config: Any = getattr(part, "config", None)
        if getattr(config, "_attn_implementation", None) == ATTENTION:
            config._attn_implementation = "sdpa"
    return swapped


class DropoutKernel(StrEnum):
    """``model.dropout_kernel``: this module's masks, or torch's own (as runs before it had them)."""

    FAST = "fast"
    TORCH = "torch"


KERNELS = tuple(DropoutKernel)


def with_dropout_kernel(model: SplitModel, kernel: str) -> SplitModel:
    """``model`` (as a builder returns it: the ``fast`` kernel) with its dropout drawn by ``kernel`` (in place):
    ``fast`` leaves it; ``torch`` applies :func:`use_torch_dropout` to every part, so a run repeats the masks of
    runs made before this module existed (torch's ``bernoulli_`` draws from the same seeds)."""
    try:
        chosen = DropoutKernel(kernel)
    except ValueError:
        raise ValueError(f"dropout kernel {kernel!r} is not one of {', '.join(DropoutKernel)}") from None
    if chosen is DropoutKernel.TORCH:
        for part in model.parts():
            use_torch_dropout(part)
    return model


def with_fast_dropout(model: SplitModel) -> SplitModel:
    """``model`` with :func:`use_fast_dropout` applied to its embedding, blocks and head (in place); every model
    builder of this package returns its model through this, so the CU, the devices, the server and the central
    recipe draw their masks the same way."""
    for part in model.parts():
        use_fast_dropout(part)
    return model


ATTENTION = "collapipe_fast_dropout"  # the name :func:`attention` is registered under with transformers


def attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A Hugging Face attention function (``AttentionInterface``): torch's ``scaled_dot_product_attention`` (its
    fused kernels) unless the attention probabilities are dropped in training on the CPU, where sdpa falls back to
    its unfused arithmetic anyway and would draw the mask with ``bernoulli_``; there, softmax(q k^T scaling + mask)
    with :func:`fast_dropout` on the probabilities, times v. Returns (output as (batch, tokens, heads, head dim),
    the probabilities or None), as the library's own functions do."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not module.training or dropout == 0.0 or query.device.type != "cpu":
        p = dropout if module.training else 0.0  # sdpa drops whenever it is given p > 0
        return sdpa_attention_forward(module, query, key, value, attention_mask, p, scaling, **kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = fast_dropout(torch.softmax(scores, dim=-1), dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def register_attention() -> str:
    """Register :func:`attention` with transformers (idempotent) and return its name, for a config's
    ``_attn_implementation``. Called where the BERT blocks are defined, so every process that unpickles one has it."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, attention)
    return ATTENTION
