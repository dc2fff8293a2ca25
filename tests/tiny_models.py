"""Tiny seeded models for the pipeline's tests (dropout off, two heads): a BERT with a token-classification head and a
translation Transformer whose blocks are torch's own."""

from __future__ import annotations

import torch

from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.models.transformer import TransformerConfig, build_transformer


def tiny_bert(vocab_size: int, hidden: int, d_ff: int, layers: int, num_labels: int):
    """BERT split for the pipeline, built after ``torch.manual_seed(0)``: ``layers`` blocks of width ``hidden``, two
    heads, no dropout, positions up to 64, a token-classification head over ``num_labels`` labels."""
    torch.manual_seed(0)
    return build_bert(
        BertSplitConfig(
            vocab_size=vocab_size,
            hidden=hidden,
            n_heads=2,
            d_ff=d_ff,
            layers=layers,
            dropout=0.0,
            max_len=64,
            head="token",
            num_labels=num_labels,
        )
    )


def tiny_transformer(vocab_size: int, hidden: int, d_ff: int, layers: int):
    """The translation Transformer split for the pipeline, built after ``torch.manual_seed(0)``: ``layers`` blocks of
    width ``hidden`` (torch's own ``TransformerEncoderLayer``), two heads, one decoder layer, no dropout, positions up
    to 64, one vocabulary of ``vocab_size`` on both sides (0 the padding).

    For the Ray tests whose subject is the executor, not a model family: a device actor that unpickles these blocks
    imports torch alone, where BERT's blocks also import transformers' BERT (about 6 s more per actor start here)."""
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab=vocab_size,
        tgt_vocab=vocab_size,
        d_model=hidden,
        n_heads=2,
        d_ff=d_ff,
        enc_layers=layers,
        dec_layers=1,
        dropout=0.0,
        max_len=64,
        pad_id=0,
    )
    return build_transformer(config)


def translation_batch(
    vocab_size: int, B: int = 8, T: int = 8, T_tgt: int = 6, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A seeded batch for :func:`tiny_transformer` laid out as the translation task collates one: ``B`` full-length
    sources of ``T`` tokens, targets of ``T_tgt - 1`` tokens, the decoder reading BOS + target and predicting
    target + EOS (ids: 0 PAD, 2 BOS, 3 EOS, words from 4)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(4, vocab_size, (B, T_tgt - 1), generator=g)
    return {
        "input_ids": torch.randint(4, vocab_size, (B, T), generator=g),
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "decoder_input_ids": torch.cat([torch.full((B, 1), 2), words], dim=1),
        "labels": torch.cat([words, torch.full((B, 1), 3)], dim=1),
    }
