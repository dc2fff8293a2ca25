"""Memory of a segment on device k: parameters + optimizer state + activations kept for backward.

Two views of the same quantity (constraint C7, gamma_k^max):
- measured: :class:`SavedTensorMeter` sums the bytes of the tensors autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), counting each storage once and never a parameter;
  :func:`param_bytes` / :func:`optimizer_state_bytes` read the modules and the optimizer;
- estimated (no forward needed, so DSSRA can use it while planning): :func:`block_memory_bytes` for one
  TEB of hidden size H, FFN size F, h heads, and :func:`max_blocks_per_device` for a memory budget.
GPipe keeps the activations of all m micro-batches until the backward pass, so the activation term
is for the whole batch b (b_hat * m tokens), whatever m is. With re-materialization (``pipeline.checkpoint``)
a stage keeps only a checkpointed micro-batch's segment input z^s and recomputes one micro-batch's activations
at a time in the backward: :func:`segment_memory_bytes` of delta_k blocks is then delta_k x gamma per TEB at the
samples held in full (``system.pipeline_model.held_activation_samples``) plus the inputs of the others, a term
that does not grow with delta_k (:func:`max_blocks_per_device` takes it as ``fixed_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

# Optimizer state tensors per parameter element: Adam/AdamW keep exp_avg and exp_avg_sq.
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "sgd": 1, "sgd_plain": 0}


class HasOptimizerState(Protocol):
    """An optimizer as far as its memory goes: ``state`` = {parameter: {slot name: value}}."""

    @property
    def state(self) -> Mapping[Any, Mapping[str, Any]]: ...


@runtime_checkable
class SizedBlock(Protocol):
    """A TEB that names its sizes (hidden H, FFN F, h heads), as the blocks of ``collapipe_flwr.models`` do."""

    hidden_size: int
    ffn_size: int
    num_heads: int


def param_bytes(modules: Iterable[nn.Module] | nn.Module) -> int:
    """Bytes of every parameter (each counted once)."""
    if isinstance(modules, nn.Module):
        modules = [modules]
    seen, total = set(), 0
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


def optimizer_state_bytes(optimizer: HasOptimizerState | None) -> int:
    """Bytes of the optimizer's state tensors (Adam: exp_avg, exp_avg_sq, step)."""
    if optimizer is None:
        return 0
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
    return total


class SavedTensorMeter:
    """Context manager: bytes autograd saves for backward inside the block, parameters excluded.

    Each storage is counted once (a view and its base share memory), so the figure is the memory that
    stays alive until backward, which is what a device must hold per micro-batch.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {self._key(t) for t in exclude}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @staticmethod
    def _key(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def _pack(self, t: torch.Tensor):
        self.count(t)
        return t

    def count(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage as held for backward, as a saved tensor is (once; never a parameter): a
        checkpointed micro-batch's input leaf, held by the stage rather than by autograd."""
        try:
            key = self._key(t)
            storage_bytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without a plain storage
            key, storage_bytes = id(t), t.numel() * t.element_size()
        if key not in self._exclude and key not in self._seen:
            self._seen.add(key)
            self.bytes += storage_bytes

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def activation_bytes_per_token(hidden: int, ffn: int, heads: int, seq_len: int, dtype_bytes: int = 4) -> float:
    """Estimated bytes one TEB saves for backward per token (fp32 by default): 8 H + 2 F + h T elements.

    Measured with :class:`SavedTensorMeter` on CPU: a BertLayer saves about 8 H + 2 F elements per token
    (LayerNorm inputs, Q/K/V, attention context and output, FFN input, FFN pre- and post-activation), a
    pre-LN ``nn.TransformerEncoderLayer`` about 4 H + 2 F; fused attention kernels keep no [T, T]
    probabilities, an eager kernel keeps h T per token, so that term is kept to stay an upper bound.
    tests/pipeline/test_pipeline_local.py checks estimate >= measured and <= 3x measured.
    """
    return dtype_bytes * (8 * hidden + 2 * ffn + heads * seq_len)


def block_param_count(hidden: int, ffn: int) -> int:
    """Parameters of one encoder block: 4 H^2 + 4 H (attention) + 2 H F + F + H (FFN) + 4 H (two LNs)."""
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * ffn + ffn + hidden + 4 * hidden


def block_memory_bytes(
    hidden: int,
    ffn: int,
    heads: int,
    batch: int,
    seq_len: int,
    optimizer: str = "adam",
    dtype_bytes: int = 4,
    params: int | None = None,
) -> int:
    """gamma per TEB: params + optimizer state + activations of the whole batch (GPipe keeps all m)."""
    n = block_param_count(hidden, ffn) if params is None else params
    slots = OPTIMIZER_SLOTS.get(optimizer, 2)
    static = n * dtype_bytes * (1 + slots)
    acts = activation_bytes_per_token(hidden, ffn, heads, seq_len, dtype_bytes) * batch * seq_len
    return int(math.ceil(static + acts))


def module_block_memory_bytes(block: nn.Module, batch: int, seq_len: int, optimizer: str = "adam") -> int:
    """:func:`block_memory_bytes` for a built block (uses its real parameter count and dtype).

    Blocks built by ``collapipe_flwr.models`` expose ``hidden_size``, ``ffn_size``, ``num_heads``; a
    block without them is counted by its parameters and optimizer state only.
    """
    params = list(block.parameters())
    n = sum(p.numel() for p in params)
    dtype_bytes = params[0].element_size() if params else 4
    if isinstance(block, SizedBlock):  # has hidden_size, ffn_size and num_heads
        return block_memory_bytes(
            block.hidden_size, block.ffn_size, block.num_heads, batch, seq_len, optimizer, dtype_bytes, params=n
        )
    return n * dtype_bytes * (1 + OPTIMIZER_SLOTS.get(optimizer, 2))


def input_bytes(hidden: int, samples: int, seq_len: int, dtype_bytes: int = 4) -> int:
    """The segment inputs z^s a stage keeps of checkpointed micro-batches: ``samples`` x T x H values."""
    return int(samples) * int(seq_len) * int(hidden) * int(dtype_bytes)


def module_input_bytes(block: nn.Module, samples: int, seq_len: int) -> int:
    """:func:`input_bytes` for a built block (its ``hidden_size`` and parameter dtype); 0 for a block that does
    not name its sizes (its activations are not estimated either)."""
    if not isinstance(block, SizedBlock):
        return 0
    params = list(block.parameters())
    return input_bytes(block.hidden_size, samples, seq_len, params[0].element_size() if params else 4)


def segment_memory_bytes(
    block: nn.Module, delta_k: int, full_samples: int, input_samples: int, seq_len: int, optimizer: str = "adam"
) -> int:
    """gamma of a segment of delta_k copies of ``block``: delta_k x :func:`module_block_memory_bytes` at the
    ``full_samples`` whose activations the stage holds in full, plus the segment inputs of ``input_samples``
    checkpointed ones (``system.pipeline_model.held_activation_samples`` gives both; (b, 0) without
    re-materialization, the GPipe figure delta_k x gamma(b))."""
    per_block = module_block_memory_bytes(block, full_samples, seq_len, optimizer)
    return int(delta_k) * per_block + module_input_bytes(block, input_samples, seq_len)


def max_blocks_per_device(memory_bytes: Sequence[float], per_block_bytes: float, fixed_bytes: float = 0.0) -> list[int]:
    """How many TEBs each device's budget gamma_k^max holds: floor((gamma_k - fixed) / per-block bytes), with
    ``fixed_bytes`` what the stage holds whatever delta_k (checkpointed micro-batches' inputs; 0 without)."""
    if per_block_bytes <= 0:
        return [10**9 for _ in memory_bytes]
    return [int((m - fixed_bytes) // per_block_bytes) for m in memory_bytes]
