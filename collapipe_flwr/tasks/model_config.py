"""conf/model/<name>.yaml -> checked sizes -> a SplitModel from collapipe_flwr.models.

A model config names its ``family`` (transformer | bert), its sizes, ``dropout``, ``max_len`` (positions),
for BERT ``pretrained_dir`` ("" = random init), and ``optimizer`` (an OptimizerSpec mapping). The task
adds what the data decides: vocabulary sizes, pad id, number of labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.optim import OptimizerSpec

SIZE_KEYS = {
    "transformer": ("d_model", "n_heads", "d_ff", "enc_layers", "dec_layers", "max_len"),
    "bert": ("hidden", "n_heads", "d_ff", "layers", "max_len"),
}
OPTIONAL_KEYS = {"family", "dropout", "optimizer", "pretrained_dir", "name", "description", "schedule", "tie_embeddings"}


def validate_model_config(model_cfg: Mapping[str, Any], family: str, task_name: str) -> None:
    """One-line ConfigError naming the model key that is missing, mistyped or wrong for the task."""
    if not isinstance(model_cfg, Mapping):
        raise ConfigError("config group model is missing; add model=<name> (see conf/model)")
    got = model_cfg.get("family")
    if got != family:
        raise ConfigError(
            f"model.family={got!r} cannot run task {task_name!r}, which needs a {family} model; "
            f"pick model={'transformer_small' if family == 'transformer' else 'bert_small'}"
        )
    sizes = SIZE_KEYS[family]
    unknown = sorted(set(model_cfg) - set(sizes) - OPTIONAL_KEYS)
    if unknown:
        raise ConfigError(f"unknown config key model.{unknown[0]}; a {family} model has {', '.join(sizes + tuple(sorted(OPTIONAL_KEYS)))}")
    for key in sizes:
        value = model_cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.{key}={value!r} must be an integer >= 1")
    dropout = model_cfg.get("dropout", 0.1)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"model.dropout={dropout!r} must be a number in [0, 1)")
    if not isinstance(model_cfg.get("tie_embeddings", False), bool):
        raise ConfigError(f"model.tie_embeddings={model_cfg.get('tie_embeddings')!r} must be true or false")
    width = model_cfg["d_model" if family == "transformer" else "hidden"]
    if width % model_cfg["n_heads"]:
        raise ConfigError(f"model.n_heads={model_cfg['n_heads']} must divide the hidden size {width}")
    optimizer_spec(model_cfg)
    schedule = model_cfg.get("schedule") or {}
    if not isinstance(schedule, Mapping):
        raise ConfigError("model.schedule must be a mapping {warmup_steps, decay}")
    from collapipe_flwr.tasks.lr_schedule import validate_schedule

    validate_schedule(schedule)
    pretrained = model_cfg.get("pretrained_dir") or ""
    if pretrained and not Path(str(pretrained)).expanduser().is_dir():
        raise ConfigError(f"model.pretrained_dir={pretrained!r} is not a folder; download bert-base-chinese there or set it to \"\"")


def optimizer_spec(model_cfg: Mapping[str, Any]) -> OptimizerSpec:
    """The model config's ``optimizer`` section as an OptimizerSpec (Adam, lr 1e-3 when absent)."""
    raw = model_cfg.get("optimizer") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("model.optimizer must be a mapping {name, lr, weight_decay, betas}")
    try:
        return OptimizerSpec.from_dict(dict(raw))
    except TypeError as err:
        raise ConfigError(f"bad model.optimizer {dict(raw)}: {err}; valid keys are name, lr, weight_decay, betas, momentum") from None


def build_translation_model(model_cfg: Mapping[str, Any], src_vocab: int, tgt_vocab: int, pad_id: int, label_smoothing: float = 0.0):
    from collapipe_flwr.models.transformer import build_transformer

    return build_transformer(
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        d_model=model_cfg["d_model"],
        n_heads=model_cfg["n_heads"],
        d_ff=model_cfg["d_ff"],
        enc_layers=model_cfg["enc_layers"],
        dec_layers=model_cfg["dec_layers"],
        dropout=float(model_cfg.get("dropout", 0.1)),
        max_len=model_cfg["max_len"],
        pad_id=pad_id,
        label_smoothing=label_smoothing,
        tie_embeddings=bool(model_cfg.get("tie_embeddings", False)),
    )


def build_bert_model(model_cfg: Mapping[str, Any], vocab_size: int, head: str, num_labels: int):
    from collapipe_flwr.models.bert import build_bert

    return build_bert(
        vocab_size=vocab_size,
        hidden=model_cfg["hidden"],
        n_heads=model_cfg["n_heads"],
        d_ff=model_cfg["d_ff"],
        layers=model_cfg["layers"],
        dropout=float(model_cfg.get("dropout", 0.1)),
        max_len=model_cfg["max_len"],
        head=head,
        num_labels=num_labels,
        pretrained_dir=str(model_cfg.get("pretrained_dir") or "") or None,
    )
