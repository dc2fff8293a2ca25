"""Flower's run config (``[tool.flwr.app.config]``, ``flwr run . --run-config "..."``) -> Hydra overrides.

The settings users change most have flat keys of their own; everything else goes through ``overrides``
(Hydra syntax, one string). A flat key left at its default (``""`` or ``0``) means "as ``conf/`` says".

    flwr run . --run-config "num-server-rounds=3 task='ner' local-steps=10"
    flwr run . --run-config 'overrides="scheduler.V=10 dataplane.compression=fp16"'

Naming one setting both ways is refused: there would be no telling which one wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collapipe_flwr.config.hydra_conf import split_overrides
from collapipe_flwr.errors import ConfigError

# flat run-config key -> the Hydra key it sets
FLAT_KEYS: dict[str, str] = {
    "num-server-rounds": "federation.num_rounds",
    "num-clusters": "federation.num_clusters",
    "local-steps": "federation.local_steps",
    "task": "task",
    "model": "model",
    "method": "method",
    "scheduler": "scheduler",
    "precision": "runtime.precision",
    "device": "runtime.device",
    "run-name": "run_name",
    "resume": "resume",
    "preset": "preset",
}
OTHER_KEYS = ("overrides", "data-dir", "output-dir")


def _override(flat: str, hydra_key: str, value: Any) -> str | None:
    """``hydra_key=value`` for a flat key that is set, else None."""
    if isinstance(value, bool):
        if flat != "resume":
            raise ConfigError(f"run-config key {flat}={value!r} must be a number or a name, not true/false")
        return "resume=true" if value else None
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"run-config key {flat}={value!r} must be a whole number")
        if int(value) < 0:
            raise ConfigError(f"run-config key {flat}={value!r} must be >= 0 (0 = as conf/ says)")
        return f"{hydra_key}={int(value)}" if int(value) else None
    text = str(value or "").strip()
    if flat == "resume":
        if text.lower() in ("", "false"):
            return None
        if text.lower() == "true":
            return "resume=true"
        raise ConfigError(f"run-config key resume={value!r} must be true or false")
    if text and not text.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"run-config key {flat}={value!r} must be a plain name (letters, digits, _ and -)")
    return f"{hydra_key}={text}" if text else None


def hydra_overrides(run_config: Mapping[str, Any]) -> list[str]:
    """The Hydra overrides of a Flower run config: the flat keys that are set, then ``overrides``."""
    free = split_overrides(str(run_config.get("overrides", "") or ""))
    named = {item.split("=", 1)[0].lstrip("+~") for item in free}
    flat = []
    for key, hydra_key in FLAT_KEYS.items():
        item = _override(key, hydra_key, run_config.get(key, ""))
        if item is None:
            continue
        if hydra_key in named:
            raise ConfigError(
                f"{hydra_key} is set twice: by the run-config key {key} and inside overrides; keep one of them"
            )
        flat.append(item)
    return [*flat, *free]
