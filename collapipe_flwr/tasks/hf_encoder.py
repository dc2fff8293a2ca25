"""The ner and classification tasks on a pretrained Hugging Face encoder: ``family: hf``, ``model_type`` bert or
roberta read from ``model.hf_folder``'s config.json (docs/hf_bert_tasks.md).

- **Tokenizer**: the folder's own (``AutoTokenizer``, local files only), in place of the task's ``vocab_file``;
  the task's encode / collate are unchanged (NER's tags go on each character's first word piece).
- **Model**: the folder's ``*ForSequenceClassification`` (classification: the pretrained pooler + a fresh
  classifier over ``task.num_labels``) or ``*ForTokenClassification`` (NER: a fresh classifier over the task's
  tags, with a linear-chain CRF on top when ``task.crf``), the encoder's weights from the folder, the new head
  seeded. It is cut as every HF model is (models/hf/bert_like.py): ``embeddings`` on the CU, the L
  ``encoder.layer`` TEBs on the devices in segments delta_k, pooler + classifier (+ CRF) on the server.
- **LoRA** (``model.lora.enabled``): adapters on every TEB's query / key / value, the embedding and the TEBs'
  base weights frozen (stored in ``model.base_dtype``); the head always trains (its classifier starts random).
- **Dropout**: ``model.dropout`` on the hidden states and the attention probabilities (replaces the folder's).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.loading import quiet_transformers
from collapipe_flwr.tasks import hf_tokenizer
from collapipe_flwr.tasks.hf_spec import BaseDtype

if TYPE_CHECKING:  # spec.py imports the registry, which imports the tasks that import this module
    from collapipe_flwr.tasks.spec import ModelSpec

# the task heads: classification, NER (per-token softmax), NER with a CRF over the tags
HEAD_TASKS = {
    "sequence": "sequence_classification",
    "token": "token_classification",
    "token_crf": "token_classification",
}


# what may start random: the new task head (and the pooler, which some checkpoints do not hold)
FRESH = ("classifier.", "bert.pooler.", "roberta.pooler.")


def uses_folder(model: ModelSpec) -> bool:
    """Whether the task's model (and tokenizer) come from a Hugging Face encoder folder."""
    return model.hf is not None


def folder_tokenizer(model: ModelSpec) -> Any:
    """The folder's tokenizer, loaded once per process (the tasks call ``tokenizer()`` for every batch)."""
    if model.hf is None:
        raise ConfigError(f"model {model.name!r} is a {model.family} model, not a Hugging Face encoder folder")
    return _folder_tokenizer(model.hf.hf_folder, model.hf.allow_hub)


@lru_cache(maxsize=4)
def _folder_tokenizer(folder: str, allow_hub: bool) -> Any:
    tok = hf_tokenizer.folder_tokenizer(folder, allow_hub)
    if tok.pad_token_id is None:
        raise ConfigError(f"the tokenizer of model.hf_folder={folder!r} has no padding token; a BERT folder has [PAD]")
    return tok


def build_encoder_model(model: ModelSpec, vocab_size: int, head: str, num_labels: int) -> Any:
    """The folder's encoder with the task's ``head`` (:data:`HEAD_TASKS`) over ``num_labels``, split into
    embedding (CU) | L TEBs (devices) | head (server); LoRA on the TEBs with ``model.lora.enabled``. Seed the
    global RNG first: the fresh classifier (and CRF) draw from it."""
    from collapipe_flwr.models.fast_dropout import with_dropout_kernel
    from collapipe_flwr.models.hf import apply_lora, load_hf_model, lora_config, split_hf_model
    from collapipe_flwr.models.hf.classification_head import ClassificationHead, CRFClassificationHead
    from collapipe_flwr.models.hf.frozen_base import (
        frozen_base_dtype,
        loaded_storages,
        own_loaded_weights,
        store_frozen_base,
    )

    hf = model.hf
    if hf is None:
        raise ConfigError(f"model {model.name!r} is a {model.family} model, not a Hugging Face encoder folder")
    overrides = {
        "num_labels": int(num_labels),
        "problem_type": "single_label_classification",
        "hidden_dropout_prob": model.dropout,
        "attention_probs_dropout_prob": model.dropout,
        "classifier_dropout": None,  # the classifier's dropout follows hidden_dropout_prob
    }
    with quiet_transformers():  # its load report (and progress bar) per process; what matters is checked below
        net, info = load_hf_model(
            hf.hf_folder,
            HEAD_TASKS[head],
            allow_hub=hf.allow_hub,
            config_kwargs=overrides,
            ignore_mismatched_sizes=True,  # a folder fine-tuned on other labels: its classifier is replaced
            output_loading_info=True,
        )
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(FRESH))
    if missing and not hf.allow_missing_weights:  # the encoder would train from random values without a word
        raise ConfigError(
            f"{hf.hf_folder} holds no weight for {missing[0]} ({len(missing)} encoder weights missing); point "
            f"model.hf_folder at a pretrained {hf.model_type} checkpoint (BertModel, BertForMaskedLM, ... weights)"
        )
    if int(net.config.vocab_size) < vocab_size:
        raise ConfigError(
            f"{hf.hf_folder} has vocab_size={net.config.vocab_size} but its tokenizer has {vocab_size} tokens; "
            "the folder's weights and tokenizer files do not belong together"
        )
    loaded = loaded_storages(net)  # the weights as loaded from the folder: views into its memory-mapped file
    split = split_hf_model(net)
    if head == "token_crf" and isinstance(split.head, ClassificationHead):  # the CRF over the classifier's logits
        split.head = CRFClassificationHead(split.head.tail, num_labels)
    if hf.lora.enabled:
        lora = hf.lora
        config = lora_config(hf.model_type, lora.r, lora.alpha, lora.dropout, lora.target_modules or None)
        apply_lora(split, config, train_head=True)  # the classifier starts random: it must train
        if hf.base_dtype is not BaseDtype.FP32:  # frozen base weights in bf16 / int8 (models/hf/frozen_base.py)
            store_frozen_base(split.blocks, frozen_base_dtype(hf.base_dtype))
            own_loaded_weights(split.parts(), loaded)  # the file's mapping goes with the converted fp32 weights
    return with_dropout_kernel(split, model.dropout_kernel)
