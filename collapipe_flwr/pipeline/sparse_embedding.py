"""Row-sparse gradients for the CU's token embeddings: each micro-batch's backward touches only the rows it looked
up, and the step's gradient becomes dense once, before the optimizer update.

With m micro-batches a dense ``nn.Embedding`` backward zero-fills a V x d gradient and adds it into ``.grad`` m
times per step: for BERT's Chinese vocabulary (21,128 x 256, 21.6 MB) that is most of the CU's own CPU time in a
step (py-spy on a NER round: 49% of the CU process's samples in the embedding's backward). ``nn.Embedding``'s own
``sparse=True`` keeps each micro-batch's gradient as the looked-up rows only; :func:`densify_gradients` then
turns the summed rows into the dense gradient the optimizer reads (Adam has no sparse update that matches its
dense one). The gradient is the dense embedding's but for the order its rows are summed in (float rounding,
~1e-7 relative), so the update is the dense embedding's.

Only embeddings whose weight trains and is not shared with another module of the embedding part are switched
(a tied weight also gets a dense gradient from its other use, and the two kinds do not add).
"""

from __future__ import annotations

import torch
from torch import nn


def use_sparse_gradients(module: nn.Module) -> list[nn.Embedding]:
    """Switch every ``nn.Embedding`` of ``module`` whose trainable weight no other submodule holds to row-sparse
    gradients; returns the embeddings switched."""
    owners: dict[int, int] = {}
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    switched = []
    for sub in module.modules():
        if isinstance(sub, nn.Embedding) and sub.weight.requires_grad and owners[id(sub.weight)] == 1:
            sub.sparse = True
            switched.append(sub)
    return switched


@torch.no_grad()
def densify_gradients(module: nn.Module) -> None:
    """Every sparse ``.grad`` of ``module``'s parameters as the dense tensor it sums to (call before the
    optimizer's step)."""
    for p in module.parameters():
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.to_dense()
