"""Loading a Hugging Face model to split: from a local folder, from a config object, or (opt-in) the hub.

``task`` picks the ``AutoModelFor*`` class (the head the server trains). The model type is checked before
any weight is read, so an unsupported architecture fails fast with one line. Weights load in fp32 by
default: the pipeline exchanges fp32 activations and applies ``runtime.precision`` through autocast.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars (a GGUF file's "Converting and de-quantizing", "Loading weights") and library
    warnings off for a while, so a run's log keeps one line per event (process-wide settings, restored after)."""
    from transformers.utils import logging as hf_logging

    level, shown = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if shown:
            hf_logging.enable_progress_bar()


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
    models/packaged.py); ``gguf_file``: config and weights (dequantised to ``dtype``) come from that GGUF file in
    the folder (transformers reads it with the ``gguf`` package)."""
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
    where = str(folder) if local else str(source)
    gguf = {"gguf_file": gguf_file} if gguf_file else {}
    with quiet_transformers():
        config = AutoConfig.from_pretrained(where, local_files_only=local, **gguf, **(config_kwargs or {}))
        check_supported(config)
        return auto.from_pretrained(where, config=config, local_files_only=local, dtype=dtype, **gguf, **model_kwargs)


def load_split(
    source: str | Path | PretrainedConfig, task: str = "causal_lm", *, allow_hub: bool = False, **model_kwargs: Any
) -> SplitModel:
    """:func:`load_hf_model` then :func:`split_hf_model`."""
    return split_hf_model(load_hf_model(source, task, allow_hub=allow_hub, **model_kwargs))
