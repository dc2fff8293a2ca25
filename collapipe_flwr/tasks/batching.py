"""Turning example indices into batches of b samples (paper: batch size b, split later into m
micro-batches) and padding token sequences to a rectangle.

``batch_order`` is pure: the same (indices, b, seed) gives the same batches. With ``lengths`` and
``bucket`` > 1 it sorts each window of ``bucket * b`` shuffled examples by length before cutting it, so
sentences of similar length share a batch (less padding, same examples per epoch).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    lengths: Sequence[int] | None = None,
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


def pad(sequences: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    """A [B, T] long tensor of ``sequences`` right-padded with ``value`` to the longest one."""
    width = max((len(s) for s in sequences), default=0)
    out = torch.full((len(sequences), width), value, dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            out[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    return out


def attention_mask(sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """[B, T] long mask, 1 on real tokens and 0 on padding."""
    return pad([[1] * len(s) for s in sequences], 0)
