"""Splitting a batch into m micro-batches (GPipe, paper Section III.D).

A batch is a ``dict[str, Tensor]`` with the batch on dim 0 (see docs/contracts.md). ``split_batch``
cuts every tensor into m nearly equal chunks with ``torch.tensor_split``, so micro-batch sizes differ by
at most one sample, as in torchgpipe's ``scatter``.
"""

from __future__ import annotations

import torch

from collapipe_flwr.errors import ConfigError


def batch_size(batch: dict[str, torch.Tensor]) -> int:
    """b: the number of samples in ``batch`` (dim 0 of every tensor)."""
    sizes = {int(t.shape[0]) for t in batch.values()}
    if len(sizes) != 1:
        raise ConfigError(
            f"batch tensors disagree on the batch size: {sorted(sizes)}; every tensor needs the batch on dim 0"
        )
    return sizes.pop()


def split_batch(batch: dict[str, torch.Tensor], m: int) -> list[dict[str, torch.Tensor]]:
    """Cut ``batch`` into min(m, b) micro-batches (views, no copy); m < 1 is an error.

    m is the plan's count for a full batch of b samples. A shorter batch (a partition's last of an epoch,
    b' < m) runs as b' micro-batches of one sample, as torchgpipe's ``scatter`` (``tensor.chunk(m)``) gives
    fewer chunks than asked: the step is still the plain model's step on that batch.
    """
    b = batch_size(batch)
    if m < 1:
        raise ConfigError(f"m={m} micro-batches: choose m >= 1")
    m = min(m, b)
    chunks = {k: torch.tensor_split(v, m, dim=0) for k, v in batch.items()}
    return [{k: chunks[k][i] for k in batch} for i in range(m)]
