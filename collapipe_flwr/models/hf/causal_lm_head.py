"""The server part of a decoder-only causal LM: final norm + LM head, trained on next-token prediction.

``loss_terms`` follows the explicit loss scaling of docs/contracts.md: the SUM of the next-token
cross-entropies over the targets and the target count, so ``sum / count`` is exactly the mean loss the HF
model reports for ``labels`` (``ForCausalLMLoss``: position t predicts labels[t + 1], -100 ignored).
Labels are given unshifted, as HF takes them (``batch["labels"]`` [B, T], -100 at padding); without them
the targets are the input ids with padding (attention_mask == 0) set to -100.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from collapipe_flwr.models.split import TaskHead

IGNORE = -100


def causal_labels(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Unshifted labels [B, T]: ``batch["labels"]``, else ``input_ids`` with -100 where attention_mask is 0."""
    if "labels" in batch:
        return batch["labels"]
    return batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE)


class CausalLMHead(TaskHead):
    """norm (GPT-2's ln_f, Llama's RMSNorm) then lm_head; ``tied``: lm_head.weight is this split's own copy of
    the token embedding the original ties it to (see ``tying.py``)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module, tied: bool = False) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head
        self.tied = bool(tied)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, V] of z_enc ``hidden`` [B, T, H]."""
        return self.lm_head(self.norm(hidden))

    def loss_terms(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of next-token cross-entropies over targets != -100, their number); fp32 logits as HF."""
        targets = causal_labels(batch)[:, 1:]
        logits = self.logits(hidden[:, :-1]).float()
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        return loss_sum, (targets != IGNORE).sum()

    def target_count(self, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The next-token targets :meth:`loss_terms` counts: ``labels[:, 1:] != -100``."""
        return (causal_labels(batch)[:, 1:] != IGNORE).sum()

    def predict(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Argmax next token [B, T] at every position (teacher-forced)."""
        return self.logits(hidden).argmax(-1)
