"""Hugging Face models cut into CollaPipe's three modules (paper Section III.B, eqs. (3)-(4)).

theta^FM = theta^enc (+) theta^dec (eq. (3)): the embedding runs on the cluster's CU, the L Transformer
blocks (TEBs) are cut into segments delta_k that the devices train as a GPipe pipeline
(theta^enc = theta^1 (+) ... (+) theta^S, eq. (4)), the final part (norm + LM head, or pooler + classifier)
runs on the server. :func:`split_hf_model` returns a :class:`~collapipe_flwr.models.split.SplitModel`
(family ``"hf"``) that plugs into ``ClusterPipeline`` and ``LocalHead`` unchanged.

Block contract (unchanged): ``block(hidden [B,T,H], attention_mask [B,T]) -> hidden [B,T,H]``. The
extra inputs a HF layer needs (position ids, the 4-D causal / padding mask, rotary cos-sin) are NOT
carried with the hidden state: each block recomputes them from (hidden, attention_mask) with the
original model's own functions and modules (``blocks.py``, ``masks.py``). Carrying them would make the
activation between segments a tuple, which the stages, the Ray backend and the data plane (one [B,T,H]
tensor, checked against H) would all have to learn per family; recomputing is exact (the same pure
function of the same inputs the original evaluates once) and costs O(T + B T^2) per block against the
block's O(B T H^2). The pipeline thus never learns the family.

Modules: ``support`` (supported types, the error), ``blocks`` (the block base), ``masks``, ``gpt2``,
``llama`` (Llama / Qwen2 / Mistral), ``bert_like`` (BERT / RoBERTa), ``causal_lm_head``,
``classification_head``, ``tying`` (tied embeddings across CU and server), ``splitter``, ``loading``,
``gguf_cache`` (a GGUF base dequantised once per machine), ``quiet``, ``lora``.
"""

from collapipe_flwr.models.hf.loading import load_hf_model, load_split
from collapipe_flwr.models.hf.lora import (
    apply_lora,
    lora_config,
    trainable_bytes,
    trainable_parameter_count,
    trainable_state_dict,
)
from collapipe_flwr.models.hf.splitter import FAMILY, split_hf_model
from collapipe_flwr.models.hf.support import SUPPORTED
from collapipe_flwr.models.hf.tying import sync_tied_gradients, tied_pairs

__all__ = [
    "FAMILY",
    "SUPPORTED",
    "apply_lora",
    "load_hf_model",
    "load_split",
    "lora_config",
    "split_hf_model",
    "sync_tied_gradients",
    "tied_pairs",
    "trainable_bytes",
    "trainable_parameter_count",
    "trainable_state_dict",
]
