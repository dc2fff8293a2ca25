"""Tied input/output embeddings (GPT-2's lm_head = wte; Llama-style ``tie_word_embeddings``) across the split.

In the original one matrix W [V, H] is both the token embedding (on the CU in CollaPipe) and the LM head
(on the server), and its gradient is the sum of both uses: dL/dW = g_emb + g_head. The CU and the server
are different machines, so the split cannot hold one Parameter in both places. It UNTIES W into two
copies with equal values: the embedding keeps the model's own Parameter, the head gets a clone.

- Loss and every activation gradient are unchanged (same values in both copies); the sum of the two
  copies' gradients is the tied original's gradient.
- To keep training equal to the tied original, both copies must take the summed gradient every step:
  :func:`sync_tied_gradients` (in one process; across CU and server it means exchanging a V x H
  gradient per step). With identical element-wise optimizers on both sides the copies then stay equal.
- Without the exchange the two copies drift apart: a valid but different (untied) model.
- With LoRA (``lora.py``) the embedding and the LM head are frozen base weights, so the copies stay equal
  and the tie costs nothing: the recommended way to fine-tune a tied model here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from collapipe_flwr.models.split import SplitModel


def untied_copy(lm_head: nn.Linear) -> nn.Linear:
    """A new Linear with the values of ``lm_head`` (weight and bias), sharing no Parameter with it."""
    out_features, in_features = lm_head.weight.shape
    copy = nn.Linear(in_features, out_features, bias=lm_head.bias is not None)
    copy.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)
    with torch.no_grad():
        copy.weight.copy_(lm_head.weight)
        if lm_head.bias is not None:
            copy.bias.copy_(lm_head.bias)
    return copy


def tied_pairs(split: SplitModel) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(embedding copy, head copy) of every matrix the original ties (empty for an untied model)."""
    embedding: Any = split.embedding
    head: Any = split.head
    if not getattr(head, "tied", False):
        return []
    return [(embedding.token_embedding.weight, head.lm_head.weight)]


@torch.no_grad()
def sync_tied_gradients(split: SplitModel) -> None:
    """Give both copies of every tied matrix the tied original's gradient, the sum of theirs (call between
    backward and the optimizer steps)."""
    for a, b in tied_pairs(split):
        if a.grad is None and b.grad is None:
            continue
        grads = [g for g in (a.grad, b.grad) if g is not None]
        total = grads[0] + grads[1] if len(grads) == 2 else grads[0]
        a.grad, b.grad = total.clone(), total.clone()
