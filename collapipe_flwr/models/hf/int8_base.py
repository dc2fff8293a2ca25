"""The frozen base weights of the TEBs stored in int8 (``model.base_dtype: int8``): torchao's int8 weight-only
quantization, LoRA adapters in fp32 on top.

The quantizer is torchao's (``quantize_(layer, Int8WeightOnlyConfig())``: symmetric, one fp32 scale per output
row, ``Int8Tensor``); so is the product (``F.linear`` on an ``Int8Tensor``: x times the int8 weight cast to x's
dtype, times the row scales) and the way back (``Int8Tensor.dequantize``). What this module adds is where the
bytes live and what autograd keeps:

- torchao's ``Int8Tensor`` parameter (and peft's ``TorchaoLoraLinear`` over it) trains LoRA correctly, but its
  ``F.linear`` runs under autograd as ``mm(x, int8.to(fp32))``, which saves the fp32 copy of every weight for the
  backward: a segment's saved tensors grow by 4 bytes a base weight, more than the int8 base saves. A converted
  layer (:class:`Int8BaseLinear`) runs torchao's product inside an autograd function that saves the int8 weight
  and its scales only and dequantizes them again for the input's gradient (the weight takes none), so no fp32
  copy outlives one call;
- the int8 weight and its scales are two plain frozen parameters (``weight`` int8 [out, in], ``weight_scale``
  fp32 [out, 1]) rather than one tensor subclass: state dicts, Flower's arrays (numpy), the stages' hand-over
  and every byte count (``p.element_size()``: 1) see ordinary tensors, a download carries the int8 weight
  exactly, and DSSRA's gamma_0 (C7, system/workload.py) sees a quarter of the fp32 bytes.

GPT-2's ``Conv1D`` is no ``nn.Linear`` and torchao's config does not quantize it: ``model.base_dtype: int8`` is
refused for GPT-2 at start-up (tasks/hf_spec.py). :func:`full_precision` gives back an fp32 copy (the export and
the merged evaluation, models/hf/peft_export.py, merge adapters into fp32 weights).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

M = TypeVar("M", bound=nn.Module)


def _int8_tensor(qdata: torch.Tensor, scale: torch.Tensor) -> Any:
    """torchao's ``Int8Tensor`` over a layer's stored int8 weight and row scales (no copy)."""
    from torchao.quantization import Int8Tensor  # torchao: the extra "quant" (imported when int8 is asked for)

    return Int8Tensor(qdata, scale, [1, qdata.shape[-1]], torch.float32)


class _Int8Product(torch.autograd.Function):
    """x W^T + b with W = int8 weight x row scales, frozen: saves the int8 weight and the scales only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        ctx.save_for_backward(qdata, scale)
        bias = None if bias is None else bias.to(x.dtype)
        return F.linear(x, _int8_tensor(qdata, scale), bias)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor):
        (grad,) = grads
        qdata, scale = ctx.saved_tensors
        weight = _int8_tensor(qdata, scale).dequantize(grad.dtype)
        return grad.matmul(weight), None, None, None


class Int8BaseLinear(nn.Linear):
    """An ``nn.Linear`` whose frozen weight is int8 (``weight``) with one fp32 scale per output row
    (``weight_scale``), both from torchao's int8 weight-only quantization."""

    weight_scale: nn.Parameter

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _Int8Product.apply(input, self.weight, self.weight_scale, self.bias)


def quantize_int8(layer: nn.Linear) -> Int8BaseLinear:
    """``layer`` (a frozen ``nn.Linear``) quantized by torchao and converted to :class:`Int8BaseLinear`, in place."""
    from torchao.quantization import Int8WeightOnlyConfig, PerRow, quantize_

    quantize_(layer, Int8WeightOnlyConfig(granularity=PerRow(), set_inductor_config=False))
    quantized: Any = layer.weight  # torchao's Int8Tensor: qdata int8 [out, in], scale fp32 [out, 1], zero point 0
    layer.weight = nn.Parameter(quantized.qdata, requires_grad=False)
    layer.register_parameter("weight_scale", nn.Parameter(quantized.scale, requires_grad=False))
    layer.__class__ = Int8BaseLinear
    return layer  # type: ignore[return-value]


def full_precision(module: M) -> M:
    """A copy of ``module`` with every :class:`Int8BaseLinear` back as an fp32 ``nn.Linear`` (torchao's
    dequantization); ``module`` itself when it holds none."""
    if not any(isinstance(sub, Int8BaseLinear) for sub in module.modules()):
        return module
    out = copy.deepcopy(module)
    for sub in out.modules():
        if isinstance(sub, Int8BaseLinear):
            weight = _int8_tensor(sub.weight.detach(), sub.weight_scale.detach()).dequantize(torch.float32)
            layer: nn.Module = sub
            del layer.weight_scale
            layer.weight = nn.Parameter(weight, requires_grad=False)
            layer.__class__ = nn.Linear
    return out
