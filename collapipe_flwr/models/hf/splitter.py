"""``split_hf_model``: a loaded Hugging Face model -> :class:`SplitModel` (embedding | L TEBs | head).

The cut reuses the model's own modules (no copy, except the head's copy of a tied embedding, ``tying.py``),
so the model and its split share weights: deep-copy the model first to keep an untouched original. Every
parameter of the model must land in one of the three parts; one that does not (an architecture variant
the cut does not know) is an :class:`UnsupportedModelError` naming it, never a silently dropped weight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from transformers import (
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
)

from collapipe_flwr.errors import UnsupportedModelError
from collapipe_flwr.models.fast_dropout import with_fast_dropout
from collapipe_flwr.models.hf.bert_like import cut_bert_like
from collapipe_flwr.models.hf.gpt2 import cut_gpt2
from collapipe_flwr.models.hf.llama import cut_llama_style
from collapipe_flwr.models.hf.support import check_supported
from collapipe_flwr.models.split import SplitModel, TaskHead

FAMILY = "hf"
Cut = Callable[[Any], tuple[nn.Module, list[nn.Module], TaskHead]]
# The task classes the splitter cuts, by model type (a subclass of one of them is cut the same way).
CUTS: dict[str, tuple[tuple[type, ...], Cut]] = {
    "bert": ((BertForSequenceClassification, BertForTokenClassification), cut_bert_like),
    "roberta": ((RobertaForSequenceClassification, RobertaForTokenClassification), cut_bert_like),
    "gpt2": ((GPT2LMHeadModel,), cut_gpt2),
    "llama": ((LlamaForCausalLM,), cut_llama_style),
    "qwen2": ((Qwen2ForCausalLM,), cut_llama_style),
    "mistral": ((MistralForCausalLM,), cut_llama_style),
}


def split_hf_model(model: nn.Module) -> SplitModel:
    """Cut ``model`` into embedding (CU) | L TEBs (devices) | head (server); sets ``use_cache=False``."""
    config: Any = getattr(model, "config", None)
    model_type = check_supported(config)
    classes, cut = CUTS[model_type]
    if not isinstance(model, classes):
        raise UnsupportedModelError(
            f"{type(model).__name__} is not supported: a {model_type} model is split from "
            f"{' or '.join(c.__name__ for c in classes)} (load it with the matching task)"
        )
    config.use_cache = False  # training: no KV cache
    embedding, blocks, head = cut(model)
    _check_coverage(model, (embedding, nn.ModuleList(blocks), head))
    return with_fast_dropout(SplitModel(embedding=embedding, blocks=nn.ModuleList(blocks), head=head, family=FAMILY))


def _check_coverage(model: nn.Module, parts: tuple[nn.Module, ...]) -> None:
    """Every parameter of ``model`` is in one of ``parts``, else UnsupportedModelError naming the first missing."""
    held = {id(p) for part in parts for p in part.parameters()}
    for name, p in model.named_parameters():
        if id(p) not in held:
            raise UnsupportedModelError(
                f"{type(model).__name__} is not supported as configured: its weight {name} falls in no part of the "
                "split (embedding, blocks, head)"
            )
