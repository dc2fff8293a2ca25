"""The server part of a BERT-like encoder fine-tuned for classification: the HF model's own tail modules.

``tail`` maps z_enc [B, T, H] to logits: [B, C] for sequence classification (BERT: pooler on [CLS],
dropout, classifier; RoBERTa: its ``RobertaClassificationHead``), [B, T, C] for token classification
(dropout, classifier). The loss is the single-label cross-entropy the HF ``*For*Classification`` models
compute, returned as (sum over labels != -100, their number) (docs/contracts.md). :class:`CRFClassificationHead`
puts a linear-chain CRF (models/crf.py) over a token-classification tail's logits (NER with ``task.crf``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from collapipe_flwr.models.crf import LinearChainCRF
from collapipe_flwr.models.split import TaskHead


class ClassifierTail(nn.Module):
    """z_enc -> logits: ``classifier(dropout(pooler(hidden)))``, each of pooler / dropout optional."""

    def __init__(self, classifier: nn.Module, pooler: nn.Module | None = None, dropout: nn.Module | None = None):
        super().__init__()
        self.pooler = pooler
        self.dropout = dropout
        self.classifier = classifier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.pooler is not None:
            hidden = self.pooler(hidden)
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        return self.classifier(hidden)


class ClassificationHead(TaskHead):
    """Sequence or token classification on top of the TEBs (``tail`` decides which)."""

    def __init__(self, tail: ClassifierTail) -> None:
        super().__init__()
        self.tail = tail

    def loss_terms(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.tail(hidden)
        labels = batch["labels"]
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss_sum, (labels != -100).sum()

    def predict(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Argmax class per sentence [B] or per token [B, T]."""
        return self.tail(hidden).argmax(-1)


class CRFClassificationHead(ClassificationHead):
    """Token classification with a linear-chain CRF over the tags: the tail's logits [B, T, C] are the emissions
    over the labelled tokens; loss = the gold sequences' negative log-likelihood (summed over sentences, divided
    by the labelled tokens, as the per-token head's cross-entropy), prediction = Viterbi. The CRF's scores start
    at zero (a fresh head trains them)."""

    def __init__(self, tail: ClassifierTail, num_labels: int) -> None:
        super().__init__(tail)
        self.crf = LinearChainCRF(int(num_labels))

    def loss_terms(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.crf.token_loss_terms(self.tail(hidden), batch["labels"])

    def predict(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Viterbi tag per labelled token [B, T] (0 elsewhere)."""
        labels = batch["labels"] if batch is not None and "labels" in batch else None
        return self.crf.token_predict(self.tail(hidden), attention_mask, labels)
