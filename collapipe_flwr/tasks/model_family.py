"""``model.family``: the kind of model a config builds, and the kind a task runs (``Task.model_family``)."""

from __future__ import annotations

from enum import StrEnum


class ModelFamily(StrEnum):
    """The Transformer encoder-decoder (translation), a BERT encoder (ner, classification), or a Hugging Face
    model (``hf``: a causal LM, or a pretrained BERT / RoBERTa folder for the encoder tasks; tasks/hf_spec.py)."""

    TRANSFORMER = "transformer"
    BERT = "bert"
    HF = "hf"
