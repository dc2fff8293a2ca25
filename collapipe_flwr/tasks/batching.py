"""Turning example indices into batches of b samples (paper: batch size b, split later into m
micro-batches) and padding token sequences to a rectangle.

``batch_order`` is pure: the same (indices, b, seed) gives the same batches. With ``lengths`` and
``bucket`` > 1 it sorts each window of ``bucket * b`` shuffled examples by length before cutting it, so
sentences of similar length share a batch (less padding, same examples per epoch).

``pad`` rounds a batch's width up to a multiple (``task.pad_multiple``, as transformers' ``pad_to_multiple_of``):
on CPU, oneDNN compiles and keeps a primitive (with its reordered weights and scratch buffers) per matmul shape
under bf16 autocast, so a width that takes every value from 2 to max_len grows each device process by tens of MiB
a round for as long as new widths appear (the device memory drift of issue 43); widths in steps of 8 bound the
shapes and the memory (docs/testbed.md: measured).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from collapipe_flwr.errors import ConfigError

IGNORE_INDEX = -100


def batch_order(
    indices: Sequence[int],
    batch_size: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
    lengths: Sequence[int] | Mapping[int, int] | None = None,
    bucket: int = 0,
) -> list[list[int]]:
    """The batches (lists of example indices) of one pass over ``indices``."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    order = [int(i) for i in indices]
    rng = np.random.default_rng(seed)
    if shuffle:
        order = [order[i] for i in rng.permutation(len(order))]
    if lengths is not None and bucket > 1 and shuffle:
        window = bucket * batch_size
        order = [
            i
            for start in range(0, len(order), window)
            for i in sorted(order[start : start + window], key=lambda j: lengths[j])
        ]
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if shuffle and lengths is not None and bucket > 1:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def padded_width(longest: int, multiple: int = 1, limit: int = 0) -> int:
    """The width a batch whose longest sequence has ``longest`` tokens is padded to: ``longest`` rounded up to a
    multiple of ``multiple``, but never past ``limit`` (the task's max_len, which the model's positions hold) when
    ``longest`` fits in it."""
    if multiple < 1:
        raise ConfigError(f"pad multiple {multiple!r} must be >= 1; set task.pad_multiple to 1 (no rounding) or more")
    width = -(-longest // multiple) * multiple
    return min(width, max(limit, longest)) if limit > 0 else width


def pad(sequences: Sequence[Sequence[int]], value: int, multiple: int = 1, limit: int = 0) -> torch.Tensor:
    """A [B, T] long tensor of ``sequences`` right-padded with ``value`` to the longest one, T rounded up by
    :func:`padded_width`."""
    width = padded_width(max((len(s) for s in sequences), default=0), multiple, limit)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            out[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    return out


def attention_mask(sequences: Sequence[Sequence[int]], multiple: int = 1, limit: int = 0) -> torch.Tensor:
    """[B, T] long mask, 1 on real tokens and 0 on padding (T as :func:`pad` gives it)."""
    return pad([[1] * len(s) for s in sequences], 0, multiple, limit)
