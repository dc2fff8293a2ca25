"""Architecture sizes of the causal LMs (and of the BERT / RoBERTa encoders), in the project's words and in each
Hugging Face config's words (imports no transformers until a config is built, so parsing a model config stays fast).

``model.hidden / n_heads / d_ff / layers / max_len`` (conf/model/<name>.yaml) map onto the config keys of
each model type (GPT-2: ``n_embd``, ``n_head``, ``n_inner``, ``n_layer``, ``n_positions``; Llama-style:
``hidden_size``, ...). :func:`inline_config` builds a from-scratch config (no checkpoint, nothing
downloaded), :func:`folder_sizes` reads the sizes back from a model folder's ``config.json`` (plain JSON,
without importing transformers), so the config is checked before any weight is read. layers is L, the TEBs
cut into segments delta_k.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError

SIZES = ("hidden", "n_heads", "d_ff", "layers", "max_len")
_LLAMA_KEYS = {
    "hidden": "hidden_size",
    "n_heads": "num_attention_heads",
    "d_ff": "intermediate_size",
    "layers": "num_hidden_layers",
    "max_len": "max_position_embeddings",
}
# {model type: {project size: config key}}, the decoder-only types the splitter cuts (support.CAUSAL_LM)
CONFIG_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {"hidden": "n_embd", "n_heads": "n_head", "d_ff": "n_inner", "layers": "n_layer", "max_len": "n_positions"},
    "llama": _LLAMA_KEYS,
    "qwen2": _LLAMA_KEYS,
    "mistral": _LLAMA_KEYS,
}
CAUSAL_LM_TYPES = tuple(CONFIG_KEYS)
# the encoders (support.BERT_LIKE) the ner and classification tasks run from a model folder (tasks/hf_encoder.py);
# their config.json names the sizes as Llama-style configs do
ENCODER_TYPES = ("bert", "roberta")
CONFIG_KEYS.update({model_type: _LLAMA_KEYS for model_type in ENCODER_TYPES})
MODEL_TYPES = tuple(CONFIG_KEYS)


def check_model_type(model_type: str, key: str = "model.model_type") -> str:
    if model_type not in CONFIG_KEYS:
        raise ConfigError(
            f"{key}={model_type!r} is not a model type this project splits; pick one of {', '.join(MODEL_TYPES)} "
            f"(causal LMs: {', '.join(CAUSAL_LM_TYPES)}; encoders for ner / classification: {', '.join(ENCODER_TYPES)})"
        )
    return model_type


def read_config_json(folder: str | Path) -> dict[str, Any]:
    """``<folder>/config.json`` as a dict (one-line ConfigError when it is missing or not JSON)."""
    path = Path(folder).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"model.hf_folder: cannot read {path} ({err.__class__.__name__}); point model.hf_folder at a Hugging Face "
            "model folder (config.json, the weights, the tokenizer files)"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; the model folder is damaged")
    return data


# the weight files transformers' from_pretrained reads from a local folder, one of which must be there
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_weights(folder: str | Path, gguf_file: str = "") -> None:
    """A local model folder holds its weights (checked at start-up: without them transformers fails only when the
    model is built, after the run has started); with ``gguf_file`` the weights are that GGUF file in it."""
    path = Path(folder).expanduser()
    if gguf_file:
        if not (path / gguf_file).is_file():
            raise ConfigError(
                f"model.gguf_file={gguf_file!r} is not a file in {str(folder)!r}; name a .gguf file of the folder"
            )
        return
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(
            f"model.hf_folder={str(folder)!r} holds no weights (none of {', '.join(WEIGHT_FILES)}); copy the model's "
            "weight files into it (save_pretrained writes them)"
        )


def folder_sizes(config: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
    """(model type, {hidden, n_heads, d_ff, layers, max_len}) of a config.json (GPT-2's n_inner null = 4 n_embd)."""
    model_type = check_model_type(str(config.get("model_type") or ""), "the folder's config.json model_type")
    keys = CONFIG_KEYS[model_type]
    sizes: dict[str, Any] = {size: config.get(key) for size, key in keys.items()}
    if model_type == "gpt2" and sizes["d_ff"] is None and isinstance(sizes["hidden"], int):
        sizes["d_ff"] = 4 * sizes["hidden"]
    if model_type == "roberta" and isinstance(sizes["max_len"], int):  # positions count from pad_token_id + 1
        sizes["max_len"] -= int(config.get("pad_token_id") or 0) + 1
    bad = [size for size, value in sizes.items() if not isinstance(value, int) or isinstance(value, bool)]
    if bad:
        raise ConfigError(f"the folder's config.json has no integer {keys[bad[0]]}; the model folder is damaged")
    return model_type, {k: int(v) for k, v in sizes.items()}


def inline_config(
    model_type: str,
    sizes: Mapping[str, int],
    vocab_size: int,
    dropout: float,
    special_ids: Mapping[str, int],
    tie: bool = True,
):
    """A from-scratch ``PretrainedConfig`` of ``model_type`` with ``sizes``, the tokenizer's ``vocab_size`` and
    special ids (bos_token_id, eos_token_id, pad_token_id); dropout on every dropout the type has; ``tie``: the
    LM head shares the token embedding (models/hf/tying.py)."""
    from transformers import AutoConfig

    keys = CONFIG_KEYS[check_model_type(model_type)]
    kwargs: dict[str, Any] = {keys[size]: int(sizes[size]) for size in SIZES}
    kwargs["tie_word_embeddings"] = bool(tie)
    if model_type == "gpt2":
        kwargs.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    else:
        kwargs.update(attention_dropout=dropout, num_key_value_heads=int(sizes["n_heads"]))
    return AutoConfig.for_model(model_type, vocab_size=int(vocab_size), **kwargs, **dict(special_ids))
