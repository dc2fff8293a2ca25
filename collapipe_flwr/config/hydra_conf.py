"""Composing ``conf/config.yaml`` with Hydra overrides into a plain mapping (the overrides string split
shell-style, renamed or removed keys refused with what to write instead, the task's default model filled in)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collapipe_flwr.config.data_dir import CONF_DIR
from collapipe_flwr.config.sections import FP16_REMOVED
from collapipe_flwr.errors import ConfigError


def to_plain(data: Any) -> Any:
    """``data`` (an OmegaConf node or nested mappings / lists) as plain dicts, lists and scalars."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(data, (DictConfig, ListConfig)):
            return OmegaConf.to_container(data, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(data, Mapping):
        return {str(k): to_plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [to_plain(v) for v in data]
    return data


def split_overrides(text: str) -> list[str]:
    """Split the ``overrides`` run-config string (``"task=ner federation.num_rounds=2"``) shell-style."""
    try:
        return shlex.split(text or "")
    except ValueError as err:
        raise ConfigError(f"cannot parse overrides {text!r}: {err}; quote values with spaces") from None


def names_group(overrides: list[str], group: str) -> bool:
    """Whether the overrides choose config group ``group`` (``model=...``, ``+model=...``)."""
    return any(o.split("=", 1)[0].lstrip("+~") == group for o in overrides)


def with_task_default_model(overrides: list[str], composed: Mapping[str, Any]) -> list[str] | None:
    """The overrides plus ``model=<task.default_model>`` when the user chose a task but no model and the
    composed model is not the task's own (Hydra composes ``task`` before ``model``, so a task file
    cannot pick the model itself); None when nothing needs to change."""
    default_model = (composed.get("task") or {}).get("default_model")
    if not default_model or names_group(overrides, "model"):
        return None
    if (composed.get("model") or {}).get("name") == default_model:
        return None
    return [*overrides, f"model={default_model}"]


_RENAMED = {"model.schedule": "model.lr_schedule"}
_REMOVED = {"dataplane.fp16": FP16_REMOVED}  # a removed key -> its one-line refusal (what to write instead)


def _refuse_renamed_keys(overrides: Sequence[str]) -> None:
    """An override of a renamed or removed key says what to write instead (Hydra alone would only say it cannot
    override it)."""
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        for old, new in _RENAMED.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(f"{old} was renamed to {new}; write {new + key[len(old) :]}=... instead of {item!r}")
        if key in _REMOVED:
            raise ConfigError(_REMOVED[key])


def compose(overrides: Sequence[str] | str = (), config_dir: Path | None = None) -> dict:
    """Compose ``conf/config.yaml`` with Hydra overrides, return a plain resolved mapping. Without a
    ``model=`` override the model is the task's ``default_model``, also when an override names a key only that
    model has (``task=causal_lm model.lora.enabled=false``: the config's default model has no ``lora``)."""
    if isinstance(overrides, str):
        overrides = split_overrides(overrides)
    overrides = list(overrides)
    _refuse_renamed_keys(overrides)
    try:
        composed = _compose_once(overrides, config_dir)
    except ConfigError:
        if names_group(overrides, "model"):
            raise
        # learn the task's default model from the group choices alone, then compose everything with it
        choices = _compose_once([o for o in overrides if "." not in o.split("=", 1)[0]], config_dir)
        again = with_task_default_model(overrides, choices)
        if again is None:
            raise
        return _compose_once(again, config_dir)
    again = with_task_default_model(overrides, composed)
    return composed if again is None else _compose_once(again, config_dir)


def _compose_once(overrides: list[str], config_dir: Path | None = None) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    conf = Path(config_dir or CONF_DIR).resolve()
    if not (conf / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {conf}; run from the project root or pass the conf/ folder")
    try:
        if GlobalHydra.instance().is_initialized():  # inside @hydra.main (the sweep entry point): reuse it
            composed = hydra_compose(config_name="config", overrides=list(overrides))
        else:
            with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="collapipe"):
                composed = hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"bad config override: {first}") from None
    return to_plain(composed)
