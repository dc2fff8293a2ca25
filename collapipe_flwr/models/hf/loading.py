"""Loading a Hugging Face model to split: from a local folder, from a config object, or (opt-in) the hub.

``task`` picks the ``AutoModelFor*`` class (the head the server trains). The model type is checked before
any weight is read, so an unsupported architecture fails fast with one line. Weights load in fp32 by
default: the pipeline exchanges fp32 activations and applies ``runtime.precision`` through autocast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.gguf_cache import cached_base, damaged_entry
from collapipe_flwr.models.hf.quiet import quiet_transformers
from collapipe_flwr.models.hf.splitter import split_hf_model
from collapipe_flwr.models.hf.support import check_supported
from collapipe_flwr.models.packaged import resolve_folder
from collapipe_flwr.models.split import SplitModel

TASKS: dict[str, Any] = {
    "causal_lm": AutoModelForCausalLM,
    "sequence_classification": AutoModelForSequenceClassification,
    "token_classification": AutoModelForTokenClassification,
}


def _auto_class(task: str) -> Any:
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {', '.join(TASKS)}; pick the head to train")
    return TASKS[task]


def load_hf_model(
    source: str | Path | PretrainedConfig,
    task: str = "causal_lm",
    *,
    allow_hub: bool = False,
    dtype: torch.dtype = torch.float32,
    config_kwargs: dict[str, Any] | None = None,
    gguf_file: str = "",
    **model_kwargs: Any,
) -> Any:
    """The ``task`` model of ``source``: a config object (random init), a local folder (``local_files_only``) or,
    only with ``allow_hub=True``, a hub model id. ``model_kwargs`` go to ``from_pretrained`` / ``from_config``
    (e.g. ``attn_implementation``); ``config_kwargs`` override the folder's config.json (e.g. ``num_labels`` of a
    fresh classifier, dropout). ``source`` may be ``package:<module>[/<sub>]`` (a folder inside an installed package,
    models/packaged.py); ``gguf_file``: config and weights come from that GGUF file in the folder, dequantised once
    per machine into a cached folder that later loads read (models/hf/gguf_cache.py; a hub id: transformers
    reads the file with the ``gguf`` package at each load)."""
    auto = _auto_class(task)
    if isinstance(source, PretrainedConfig):
        check_supported(source)
        return auto.from_config(source, dtype=dtype, **model_kwargs)
    folder = Path(resolve_folder(source)).expanduser()
    local = folder.is_dir()
    if not local and not allow_hub:
        raise ConfigError(
            f"{source} is not a local folder; point at a folder holding config.json and the weights, or pass "
            "allow_hub=True to download it"
        )
    if gguf_file and local:  # dequantised once per machine, then read from the cache (models/hf/gguf_cache.py)
        entry = cached_base(source, gguf_file)
        try:
            return _from_folder(auto, str(entry), True, {}, dtype, config_kwargs, model_kwargs)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - a damaged safetensors file raises anything from OSError on
            raise damaged_entry(entry, err) from None
    where = str(folder) if local else str(source)
    gguf = {"gguf_file": gguf_file} if gguf_file else {}
    return _from_folder(auto, where, local, gguf, dtype, config_kwargs, model_kwargs)


def _from_folder(
    auto: Any,
    where: str,
    local: bool,
    gguf: dict[str, str],
    dtype: torch.dtype,
    config_kwargs: dict[str, Any] | None,
    model_kwargs: dict[str, Any],
) -> Any:
    """``auto.from_pretrained(where)`` after its config's model type is checked (transformers quiet)."""
    with quiet_transformers():
        config = AutoConfig.from_pretrained(where, local_files_only=local, **gguf, **(config_kwargs or {}))
        check_supported(config)
        return auto.from_pretrained(where, config=config, local_files_only=local, dtype=dtype, **gguf, **model_kwargs)


def load_split(
    source: str | Path | PretrainedConfig, task: str = "causal_lm", *, allow_hub: bool = False, **model_kwargs: Any
) -> SplitModel:
    """:func:`load_hf_model` then :func:`split_hf_model`."""
    return split_hf_model(load_hf_model(source, task, allow_hub=allow_hub, **model_kwargs))
