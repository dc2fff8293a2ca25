"""The Hugging Face keys of a ``family: hf`` model config (conf/model/gpt2_tiny.yaml), typed and checked once.

- ``model_type`` (gpt2 | llama | qwen2 | mistral) + the sizes hidden, n_heads, d_ff, layers (L, the TEBs cut
  into segments delta_k): a from-scratch model built from that config (nothing downloaded);
- ``hf_folder``: a local model folder (config.json, weights, tokenizer files); its config.json decides the
  type and sizes (given sizes must match it). With ``allow_hub: true`` (off by default) it may be a hub id,
  downloaded once by transformers' cache. ``package:<module>[/<sub>]`` names a folder inside an installed Python
  package (models/packaged.py), resolved on each machine where the folder is read;
- ``gguf_file``: a GGUF file in that folder holding config, weights (dequantised on load) and tokenizer;
- ``base_dtype`` (fp32 | bf16 | int8, LoRA only): the dtype the TEBs' frozen base weights are stored in (int8:
  torchao's int8 weight-only quantization of the ``nn.Linear`` layers, so not GPT-2's ``Conv1D``);
- ``allow_missing_weights`` (false): a folder whose weights lack tensors its config.json's model needs is
  refused at start-up (models/hf/folder_weights.py); true trains those from random values, and the run's
  summary says how many;
- ``lora`` {enabled, r, alpha, dropout, target_modules: auto | [names], train_head}: LoRA adapters on every
  TEB. The devices then train only theta^s_LoRA of their delta_k, and the CU's upload (eq. 11, the bits of C9
  / eq. 26) and the server's average carry only the trainable tensors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.gguf_header import gguf_config
from collapipe_flwr.models.hf_arch import (
    ENCODER_TYPES,
    check_model_type,
    check_weights,
    folder_sizes,
    read_config_json,
)
from collapipe_flwr.models.packaged import resolve_folder
from collapipe_flwr.spec_parsing import choice, require

HF_KEYS = ("model_type", "hf_folder", "allow_hub", "lora", "gguf_file", "base_dtype", "allow_missing_weights")


class BaseDtype(StrEnum):
    """``model.base_dtype``: what the frozen (non-LoRA) weights of the TEBs are stored in (models/hf/frozen_base.py)."""

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"  # torchao's int8 weight-only quantization (models/hf/int8_base.py)


BASE_DTYPES = tuple(BaseDtype)
CONV1D_TYPES = ("gpt2",)  # their TEBs' projections are transformers' Conv1D, which int8 does not quantize
_LORA_KEYS = ("enabled", "r", "alpha", "dropout", "target_modules", "train_head")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LoraSpec:
    """``model.lora``: rank r, scaling alpha / r, adapter dropout, the adapted modules (``auto``: the attention
    projections of the model type, models/hf/lora.py), and whether the server's head trains too."""

    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ()  # () = auto
    train_head: bool = False

    def __post_init__(self) -> None:
        for key in ("enabled", "train_head"):
            require(
                isinstance(getattr(self, key), bool), f"model.lora.{key}={getattr(self, key)!r} must be true or false"
            )
        require(_int(self.r) and self.r >= 1, f"model.lora.r={self.r!r} must be an integer >= 1 (the adapters' rank)")
        require(
            _int(self.alpha) and self.alpha >= 1,
            f"model.lora.alpha={self.alpha!r} must be an integer >= 1 (scaling alpha / r)",
        )
        require(
            isinstance(self.dropout, (int, float)) and not isinstance(self.dropout, bool) and 0 <= self.dropout < 1,
            f"model.lora.dropout={self.dropout!r} must be a number in [0, 1)",
        )
        object.__setattr__(self, "dropout", float(self.dropout))

    def to_raw(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": list(self.target_modules) or "auto",
            "train_head": self.train_head,
        }


def parse_lora(raw: Any) -> LoraSpec:
    """``model.lora`` (absent: LoRA off)."""
    raw = raw or {}
    require(isinstance(raw, Mapping), "model.lora must be a mapping {enabled, r, alpha, dropout, target_modules}")
    unknown = sorted(set(raw) - set(_LORA_KEYS))
    if unknown:
        raise ConfigError(f"unknown config key model.lora.{unknown[0]}; valid keys are {', '.join(_LORA_KEYS)}")
    targets = raw.get("target_modules", "auto")
    if targets in ("auto", None, ""):
        targets = ()
    require(
        isinstance(targets, (list, tuple)) and all(isinstance(t, str) and t for t in targets),
        f"model.lora.target_modules={targets!r} must be auto or a list of module names (e.g. [c_attn, c_proj])",
    )
    known = {k: raw[k] for k in ("enabled", "r", "alpha", "dropout", "train_head") if k in raw}
    return LoraSpec(**known, target_modules=tuple(targets))


@dataclass(frozen=True)
class HfSpec:
    """The Hugging Face part of ``model``: the type, the folder ("" = from scratch; ``package:<module>[/<sub>]`` = a
    folder inside an installed package, models/packaged.py), the hub opt-in, LoRA, the GGUF file in the folder that
    holds config, weights and tokenizer ("" = the folder's config.json and weight files), and the dtype of the TEBs'
    frozen base weights (bf16 halves them on the devices; LoRA adapters stay fp32)."""

    model_type: str
    hf_folder: str = ""
    allow_hub: bool = False
    lora: LoraSpec = field(default_factory=LoraSpec)
    gguf_file: str = ""
    base_dtype: BaseDtype = BaseDtype.FP32
    allow_missing_weights: bool = False

    def __post_init__(self) -> None:
        check_model_type(self.model_type)
        for key in ("allow_hub", "allow_missing_weights"):
            value = getattr(self, key)
            require(isinstance(value, bool), f"model.{key}={value!r} must be true or false")
        require(
            bool(self.hf_folder) or self.model_type not in ENCODER_TYPES,
            f"model.model_type={self.model_type} needs model.hf_folder (a pretrained {self.model_type} folder, "
            "docs/hf_bert_tasks.md); a from-scratch BERT is model=bert_tiny / bert_small",
        )
        require(
            isinstance(self.gguf_file, str) and (not self.gguf_file or bool(self.hf_folder)),
            f"model.gguf_file={self.gguf_file!r} names a file in model.hf_folder; set model.hf_folder too",
        )
        object.__setattr__(self, "base_dtype", choice("model.base_dtype", self.base_dtype, BaseDtype))
        require(
            self.base_dtype is BaseDtype.FP32 or self.lora.enabled,
            f"model.base_dtype={self.base_dtype} stores the frozen base weights and needs model.lora.enabled=true "
            "(without LoRA every weight trains, in fp32)",
        )
        if self.base_dtype is BaseDtype.INT8:
            require(
                self.model_type not in CONV1D_TYPES,
                f"model.base_dtype=int8 quantizes nn.Linear layers and {self.model_type}'s are Conv1D; use bf16",
            )
            require(
                importlib.util.find_spec("torchao") is not None,
                "model.base_dtype=int8 needs torchao: pip install 'collapipe-flwr[quant]' (torchao==0.18.0)",
            )

    @property
    def from_folder(self) -> bool:
        return bool(self.hf_folder)

    def to_raw(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "hf_folder": self.hf_folder,
            "allow_hub": self.allow_hub,
            "lora": self.lora.to_raw(),
            "gguf_file": self.gguf_file,
            "base_dtype": self.base_dtype,
            # only when set: the config.json of earlier runs stays the same (a resume compares them)
            **({"allow_missing_weights": True} if self.allow_missing_weights else {}),
        }


def _source_sizes(folder: str, allow_hub: bool, gguf_file: str = "", allow_missing: bool = False):
    """(type, sizes) of a local folder's config.json (of its GGUF file's header with ``gguf_file``), or with
    ``allow_hub`` of a hub id's config (downloaded). A ``package:`` folder is resolved here, on this machine; its
    weights must hold every tensor of the model (with ``allow_missing``: of the right shape)."""
    local = resolve_folder(folder)
    if Path(local).expanduser().is_dir():
        if gguf_file:  # config, weights and tokenizer are all in the GGUF file
            check_weights(local, gguf_file)
            return folder_sizes(gguf_config(Path(local).expanduser() / gguf_file))
        sizes = folder_sizes(read_config_json(local))  # a known architecture first, then its weights
        check_weights(local)
        from collapipe_flwr.models.hf.folder_weights import check_folder_weights

        check_folder_weights(Path(local).expanduser(), allow_missing)
        return sizes
    if not allow_hub:
        raise ConfigError(
            f"model.hf_folder={folder!r} is not a local folder; point it at a folder holding config.json, the weights "
            "and the tokenizer, or set model.allow_hub=true to download it from the Hugging Face Hub"
        )
    from transformers import AutoConfig

    return folder_sizes(AutoConfig.from_pretrained(folder, **({"gguf_file": gguf_file} if gguf_file else {})).to_dict())


def parse_hf(raw: Mapping[str, Any], size_keys: tuple[str, ...]) -> tuple[HfSpec, dict[str, Any]]:
    """(HfSpec, {size: value} incl. max_len) of a ``family: hf`` model section; a folder fills absent sizes and
    must agree with the given ones."""
    folder = str(raw.get("hf_folder") or "")
    gguf_file = raw.get("gguf_file") or ""
    require(isinstance(gguf_file, str), f"model.gguf_file={gguf_file!r} must be a file name")
    allow_hub = raw.get("allow_hub", False)
    require(isinstance(allow_hub, bool), f"model.allow_hub={allow_hub!r} must be true or false")
    given: dict[str, Any] = {k: raw.get(k) for k in (*size_keys, "max_len") if raw.get(k) is not None}
    model_type = str(raw.get("model_type") or "")
    allow_missing = raw.get("allow_missing_weights", False)
    require(isinstance(allow_missing, bool), f"model.allow_missing_weights={allow_missing!r} must be true or false")
    if folder:
        found_type, found = _source_sizes(folder, allow_hub, gguf_file, allow_missing)
        if model_type and model_type != found_type:
            raise ConfigError(
                f"model.model_type={model_type!r} but {folder} holds a {found_type} model; remove the key"
            )
        model_type = found_type
        for key, value in given.items():
            require(_int(value), f"model.{key}={value!r} must be an integer")
            limit = found[key]
            if (value > limit) if key == "max_len" else (value != limit):
                bound = f"{limit} positions" if key == "max_len" else f"{key}={limit}"
                raise ConfigError(
                    f"model.{key}={value!r} but {folder} has {bound}; remove the key (the folder's config decides it)"
                )
        given = {**found, **given}
    base_dtype = raw.get("base_dtype") or BaseDtype.FP32
    spec = HfSpec(model_type, folder, allow_hub, parse_lora(raw.get("lora")), gguf_file, base_dtype, allow_missing)
    return spec, given
