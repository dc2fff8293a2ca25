"""A :class:`~collapipe_flwr.tasks.spec.ModelSpec` -> a SplitModel from collapipe_flwr.models.

The spec gives the family's sizes, ``dropout`` and its kernel (``dropout_kernel``), ``max_len`` (positions) and
for BERT ``pretrained_dir`` ("" = random init), for a Hugging Face causal LM its folder or inline type and LoRA;
the task adds what the data decides: vocabulary sizes, pad id, number of labels, the tokenizer's special ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.fast_dropout import with_dropout_kernel
from collapipe_flwr.models.transformer import TransformerConfig, build_transformer
from collapipe_flwr.tasks.hf_spec import BaseDtype

if TYPE_CHECKING:  # spec.py imports the registry, which imports the tasks that import this module
    from collapipe_flwr.tasks.spec import ModelSpec


def build_translation_model(
    model: ModelSpec, src_vocab: int, tgt_vocab: int, pad_id: int, label_smoothing: float = 0.0
):
    """The encoder-decoder Transformer: L = enc_layers TEBs split over the devices, the decoder on the server."""
    sizes = model.sizes
    config = TransformerConfig(
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
    return with_dropout_kernel(build_transformer(config), model.dropout_kernel)


def build_bert_model(model: ModelSpec, vocab_size: int, head: str, num_labels: int):
    """BERT with L = layers TEBs and a token / token_crf / sequence head on the server."""
    # Imported here on purpose: models.bert imports transformers (seconds), which a translation run, or the
    # registry listing its tasks, never needs.
    from collapipe_flwr.models.bert import BertSplitConfig, build_bert

    sizes = model.sizes
    config = BertSplitConfig(
        vocab_size=vocab_size,
        hidden=sizes["hidden"],
        n_heads=sizes["n_heads"],
        d_ff=sizes["d_ff"],
        layers=sizes["layers"],
        dropout=model.dropout,
        max_len=model.max_len,
        head=head,
        num_labels=num_labels,
    )
    return with_dropout_kernel(build_bert(config, pretrained_dir=model.pretrained_dir or None), model.dropout_kernel)


def _folder_causal_lm(hf: Any) -> Any:
    """The causal LM of ``hf.hf_folder``; the weights transformers filled with random values (a folder of pickled
    weights, which parse_model cannot read) refused unless ``model.allow_missing_weights``."""
    from collapipe_flwr.models.hf import load_hf_model
    from collapipe_flwr.models.hf.folder_weights import check_loading_info

    if hf.gguf_file:
        return load_hf_model(hf.hf_folder, "causal_lm", allow_hub=hf.allow_hub, gguf_file=hf.gguf_file)
    net, info = load_hf_model(hf.hf_folder, "causal_lm", allow_hub=hf.allow_hub, output_loading_info=True)
    check_loading_info(hf.hf_folder, info, hf.allow_missing_weights)
    return net


def build_causal_lm(model: ModelSpec, vocab_size: int, special_ids: Mapping[str, int]):
    """A Hugging Face causal LM cut into embedding (CU) | L TEBs (devices, segments delta_k) | norm + LM head
    (server): from ``model.hf_folder`` (``package:...`` resolved here; ``model.gguf_file``: from that GGUF file),
    else from scratch (``model_type`` and sizes, the tokenizer's vocabulary); with ``model.lora.enabled`` LoRA
    adapters on every TEB and every base weight frozen (models/hf/lora.py), stored in ``model.base_dtype``."""
    from collapipe_flwr.models.hf import apply_lora, load_hf_model, lora_config, split_hf_model
    from collapipe_flwr.models.hf.frozen_base import (
        frozen_base_dtype,
        loaded_storages,
        own_loaded_weights,
        store_frozen_base,
    )
    from collapipe_flwr.models.hf_arch import inline_config

    hf = model.hf
    if hf is None:
        raise ConfigError(f"model {model.name!r} is a {model.family} model; a causal LM task needs family: hf")
    loaded: set[int] = set()  # the weights as loaded from the folder: views into its memory-mapped file
    if hf.from_folder:
        net = _folder_causal_lm(hf)
        loaded = loaded_storages(net)
        if int(net.config.vocab_size) < vocab_size:
            raise ConfigError(
                f"{hf.hf_folder} has vocab_size={net.config.vocab_size} but its tokenizer has {vocab_size} tokens; "
                "the folder's weights and tokenizer files do not belong together"
            )
    else:
        sizes = {**model.sizes, "max_len": model.max_len}
        config = inline_config(hf.model_type, sizes, vocab_size, model.dropout, special_ids, model.tie_embeddings)
        net = load_hf_model(config, "causal_lm")
    split = split_hf_model(net)
    if hf.lora.enabled:
        lora = hf.lora
        targets = lora.target_modules or None
        config = lora_config(hf.model_type, lora.r, lora.alpha, lora.dropout, targets)
        apply_lora(split, config, train_head=lora.train_head)
        if hf.base_dtype is not BaseDtype.FP32:  # frozen base weights in bf16 / int8 (models/hf/frozen_base.py)
            store_frozen_base(split.blocks, frozen_base_dtype(hf.base_dtype))
            own_loaded_weights(split.parts(), loaded)  # the file's mapping goes with the converted fp32 weights
    return with_dropout_kernel(split, model.dropout_kernel)
