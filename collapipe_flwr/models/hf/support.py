"""Which Hugging Face architectures the splitter cuts, and the one-line error for every other one.

A supported architecture is one whose forward pass we can cut into the paper's three modules (Section
III.B): the embedding (CU), the stack of L Transformer blocks (TEBs, cut into segments delta_k on the
devices) and the final part (norm + LM head, or pooler + classifier, on the server).
"""

from __future__ import annotations

from typing import Any

from collapipe_flwr.errors import UnsupportedModelError

# Encoders: embeddings (CU) | encoder.layer (TEBs) | pooler + task head (server).
BERT_LIKE = ("bert", "roberta")
# Decoder-only causal LMs: token (+ position) embedding (CU) | blocks (TEBs) | final norm + lm_head (server).
LLAMA_STYLE = ("llama", "qwen2", "mistral")
CAUSAL_LM = ("gpt2", *LLAMA_STYLE)
SUPPORTED = (*BERT_LIKE, *CAUSAL_LM)


def model_type_of(config: Any) -> str:
    """The config's ``model_type`` ("" when it has none)."""
    return str(getattr(config, "model_type", "") or "")


def check_supported(config: Any) -> str:
    """``config``'s model type if the splitter cuts it, else :class:`UnsupportedModelError` (one line)."""
    model_type = model_type_of(config)
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"model type {model_type or '(none)'!r} is not supported: no cut into embedding / Transformer blocks / "
            f"head is defined for it; supported: {', '.join(SUPPORTED)}"
        )
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "add_cross_attention", False):
        raise UnsupportedModelError(
            f"a {model_type} model with cross-attention is not supported: its blocks would need the encoder's output; "
            "load it without add_cross_attention / is_encoder_decoder"
        )
    if model_type in BERT_LIKE and getattr(config, "is_decoder", False):
        raise UnsupportedModelError(
            f"a {model_type} model with is_decoder=True is not supported: only bidirectional encoders are split; "
            "load it with is_decoder=False"
        )
    return model_type
