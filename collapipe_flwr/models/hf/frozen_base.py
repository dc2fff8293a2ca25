"""The frozen base weights of the TEBs stored in a smaller dtype (``model.base_dtype: bf16 | int8``), adapters fp32.

Under LoRA the devices hold every base weight of their segment delta_k but train only the adapters; the base is
most of a device's static memory (weights x 1, against adapters x (1 + gradient + optimizer slots)).
:func:`store_frozen_base` keeps every frozen ``nn.Linear`` (peft's ``base_layer`` of an adapted projection, and
the MLP's) and GPT-2 ``Conv1D`` of the blocks in bf16: half the bytes of fp32. Norms (a few vectors) stay fp32.

The computation stays fp32: a converted layer (:class:`FrozenBaseLinear`, :class:`FrozenBaseConv1D`, same
parameters and state-dict names) multiplies in the input's dtype with the weight cast for that product only,
and keeps only the bf16 weight for the backward (the gradient of the input; the weight takes none), so no fp32
copy outlives the call. The LoRA path, the residual stream and every gradient are fp32 as before; the only
change is that the base weights are rounded to bf16. Under ``runtime.precision=bf16`` (autocast) the product
runs in bf16 from the stored weight directly. The workload (system/workload.py) counts parameter bytes from
the real dtypes, so DSSRA's gamma_0 (C7) sees the smaller base.

``int8`` (a quarter of fp32) quantizes every frozen ``nn.Linear`` with torchao instead (models/hf/int8_base.py);
GPT-2's ``Conv1D`` has no int8 form there.

Call it after the adapters are injected: peft moves a new adapter to its base layer's dtype.

A base loaded from a folder's safetensors file is memory-mapped: every weight is a view into one mapping of the
whole file, which stays mapped (and every page the conversion read, resident) while any view lives. After the
conversion the fp32 originals of the converted layers are gone, but the weights that stay as loaded (the
embedding, the norms) keep the whole file mapped: SmolLM2-135M's 513 MiB in every process that builds the model
(server, CUs), where the weights still read from it are 108 MiB. :func:`own_loaded_weights` copies those out of
the file (same values), so the mapping and its pages go; take :func:`loaded_storages` of the model right after
loading, before the split copies anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.int8_base import quantize_int8

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    if not torch.is_autocast_enabled(x.device.type):  # autocast casts the operands itself
        weight = weight.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
    return F.linear(x, weight.t() if transposed else weight, bias)


class _FrozenProduct(torch.autograd.Function):
    """x W^T + b (``transposed``: x W + b, Conv1D's layout) with W, b frozen: saves W only (its stored dtype)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool):
        ctx.save_for_backward(weight)
        ctx.transposed = transposed
        ctx.x_dtype = x.dtype
        return _product(x, weight, bias, transposed)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor):
        (grad,) = grads
        (weight,) = ctx.saved_tensors
        weight = weight.to(grad.dtype)
        grad_x = grad.matmul(weight.t() if ctx.transposed else weight)
        return grad_x.to(ctx.x_dtype), None, None, None


class FrozenBaseLinear(nn.Linear):
    """An ``nn.Linear`` whose frozen weight is stored in a smaller dtype; computes in the input's dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _FrozenProduct.apply(input, self.weight, self.bias, False)


class FrozenBaseConv1D(Conv1D):
    """GPT-2's ``Conv1D`` (weight [in, out]) with its frozen weight stored in a smaller dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FrozenProduct.apply(x, self.weight, self.bias, True)


_CONVERTED: dict[type, type] = {nn.Linear: FrozenBaseLinear, Conv1D: FrozenBaseConv1D}


def store_frozen_base(module: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Store every frozen ``nn.Linear`` / ``Conv1D`` of ``module`` (none of its parameters trains) in ``dtype``
    and compute it as above (``torch.int8``: torchao's int8 weight-only, ``nn.Linear`` only); trainable layers
    (the adapters, a trained head) stay as they are. In place; returns the number of layers converted."""
    converted = 0
    for sub in list(module.modules()):
        cls = _CONVERTED.get(type(sub))
        if cls is None or any(p.requires_grad for p in sub.parameters(recurse=False)):
            continue
        if dtype == torch.int8:
            if not isinstance(sub, nn.Linear):
                raise ConfigError(f"an int8 frozen base quantizes nn.Linear layers only, not {type(sub).__name__}")
            quantize_int8(sub)
            converted += 1
            continue
        sub.to(dtype)
        sub.__class__ = cls
        converted += 1
    return converted


def loaded_storages(module: nn.Module) -> set[int]:
    """The data pointers of the storages of ``module``'s parameters and buffers (taken right after loading: the
    tensors that may be views into the memory-mapped checkpoint file)."""
    return {t.untyped_storage().data_ptr() for t in module.state_dict(keep_vars=True).values()}


def own_loaded_weights(modules: Iterable[nn.Module], loaded: set[int]) -> int:
    """Give every parameter and buffer of ``modules`` still in one of the ``loaded`` storages (:func:`loaded_storages`)
    memory of its own, with the same values (in place: the same Parameter objects, so the parts' references and
    flags stay); a tensor met twice (a tied weight) gets one copy. Then the checkpoint file's mapping goes
    once nothing else holds it (the large copies are mmapped by malloc: no heap left to trim). Returns the bytes
    copied."""
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], torch.Tensor] = {}
    copied = 0
    for module in modules:
        for t in module.state_dict(keep_vars=True).values():
            storage = t.untyped_storage()
            if storage.data_ptr() not in loaded:
                continue
            key = (storage.data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if key not in copies:
                copies[key] = t.detach().clone()
                copied += t.nbytes
            t.data = copies[key]
    return copied


def frozen_base_dtype(name: str) -> torch.dtype:
    """``model.base_dtype`` (fp32 | bf16 | int8) as a torch dtype."""
    return DTYPES[name]
