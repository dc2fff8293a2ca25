"""BERT-like encoders (``Bert*`` / ``Roberta*`` for sequence or token classification) cut into the paper's
three modules.

- embedding (CU): the model's ``embeddings`` (word + position + token-type 0, LayerNorm, dropout; RoBERTa
  derives its position ids from the padding in ``input_ids``, on the CU as in the original);
- L TEBs (devices): ``encoder.layer[l]``, each with the bidirectional padding mask built as ``BertModel``
  builds it (``masks.bidirectional_mask``);
- head (server): the task model's own tail (BERT: pooler + dropout + classifier; RoBERTa: its
  classification head; token classification: dropout + classifier) in a :class:`ClassificationHead`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError, UnsupportedModelError
from collapipe_flwr.models.hf.blocks import HFBlock
from collapipe_flwr.models.hf.classification_head import ClassificationHead, ClassifierTail
from collapipe_flwr.models.hf.masks import bidirectional_mask


class BertLikeEmbedding(nn.Module):
    """CU part: ``embeddings(input_ids=...)`` with the default (all-zero) token types."""

    def __init__(self, embeddings: nn.Module, max_len: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.max_len = int(max_len)

    @property
    def token_embedding(self) -> nn.Embedding:
        return self.embeddings.word_embeddings  # type: ignore[return-value]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.max_len:
            raise ConfigError(
                f"sequence length {input_ids.shape[1]} exceeds the model's {self.max_len} positions; truncate the data"
            )
        return self.embeddings(input_ids=input_ids)


class BertLikeBlock(HFBlock):
    """One TEB: a ``BertLayer`` / ``RobertaLayer`` fed the bidirectional padding mask of ``attention_mask``."""

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, bidirectional_mask(self.config, hidden, attention_mask))


def _check_single_label(config: Any) -> None:
    problem = getattr(config, "problem_type", None)
    if config.num_labels < 2 or problem not in (None, "single_label_classification"):
        raise UnsupportedModelError(
            f"problem_type={problem!r} with num_labels={config.num_labels} is not supported: the split head trains "
            "single-label classification; load the model with num_labels >= 2 and no regression / multi-label type"
        )


def cut_bert_like(model: Any) -> tuple[nn.Module, list[nn.Module], ClassificationHead]:
    """(embedding, TEBs, head) of a ``*ForSequenceClassification`` / ``*ForTokenClassification``."""
    config: Any = model.config
    _check_single_label(config)
    base: Any = model.base_model
    # RoBERTa counts positions from padding_idx + 1, so its usable length is two below the table's size
    offset = config.pad_token_id + 1 if config.model_type == "roberta" else 0
    embedding = BertLikeEmbedding(base.embeddings, config.max_position_embeddings - offset)
    blocks: list[nn.Module] = [
        BertLikeBlock(layer, config, l, config.intermediate_size) for l, layer in enumerate(base.encoder.layer)
    ]
    tail = ClassifierTail(model.classifier, pooler=base.pooler, dropout=getattr(model, "dropout", None))
    return embedding, blocks, ClassificationHead(tail)
