"""A :class:`~collapipe_flwr.tasks.spec.ModelSpec` -> a SplitModel from collapipe_flwr.models.

The spec gives the family's sizes, ``dropout``, ``max_len`` (positions) and for BERT ``pretrained_dir``
("" = random init); the task adds what the data decides: vocabulary sizes, pad id, number of labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapipe_flwr.models.transformer import build_transformer

if TYPE_CHECKING:  # spec.py imports the registry, which imports the tasks that import this module
    from collapipe_flwr.tasks.spec import ModelSpec


def build_translation_model(
    model: ModelSpec, src_vocab: int, tgt_vocab: int, pad_id: int, label_smoothing: float = 0.0
):
    """The encoder-decoder Transformer: L = enc_layers TEBs split over the devices, the decoder on the server."""
    sizes = model.sizes
    return build_transformer(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=sizes["d_model"],
        n_heads=sizes["n_heads"],
        d_ff=sizes["d_ff"],
        enc_layers=sizes["enc_layers"],
        dec_layers=sizes["dec_layers"],
        dropout=model.dropout,
        max_len=model.max_len,
        pad_id=pad_id,
        label_smoothing=label_smoothing,
        tie_embeddings=model.tie_embeddings,
    )


def build_bert_model(model: ModelSpec, vocab_size: int, head: str, num_labels: int):
    """BERT with L = layers TEBs and a token / token_crf / sequence head on the server."""
    # Imported here on purpose: models.bert imports transformers (seconds), which a translation run, or the
    # registry listing its tasks, never needs.
    from collapipe_flwr.models.bert import build_bert

    sizes = model.sizes
    return build_bert(
        vocab_size=vocab_size,
        hidden=sizes["hidden"],
        n_heads=sizes["n_heads"],
        d_ff=sizes["d_ff"],
        layers=sizes["layers"],
        dropout=model.dropout,
        max_len=model.max_len,
        head=head,
        num_labels=num_labels,
        pretrained_dir=model.pretrained_dir or None,
    )
