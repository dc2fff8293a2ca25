"""Tiny seeded models for the pipeline's tests (dropout off, two heads, a token-classification head)."""

from __future__ import annotations

import torch

from collapipe_flwr.models.bert import BertSplitConfig, build_bert


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
