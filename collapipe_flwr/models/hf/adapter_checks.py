"""A saved LoRA adapter folder's ``adapter_config.json`` checked before peft reads it (``generate --from
adapters``): read with its size bounded, every module pattern a plain module name, every rank bounded by the
layers it adapts.

peft compiles a string ``target_modules`` (and ``exclude_modules``, ``layers_pattern``, the keys of
``rank_pattern`` / ``alpha_pattern``) as a regular expression and matches it against every module name: a
pattern such as ``(.*.*)*X`` backtracks for minutes. It allocates each adapter (``r`` x the layer's width)
before reading the saved tensors: ``r = 10**8`` dies in the allocator. Here a pattern must be a list of plain
names (matched as names: the module's name or its last dotted parts), and ``r`` at most the smaller side of
each layer it names, each refusal a one-line ConfigError naming the file and the key.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError

MAX_CONFIG_BYTES = 1_000_000
NAME = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")  # a module name: no quantifier, no group
_PATTERN_KEYS = ("exclude_modules", "layers_pattern")
_RANK_MAPS = ("rank_pattern", "alpha_pattern")


def read_bounded_json(path: Path, max_bytes: int) -> Any:
    """A small JSON file of a saved run, read whole once its size is bounded; a one-line ConfigError when it is too
    large or cannot be read or parsed."""
    try:
        if path.stat().st_size > max_bytes:
            raise ConfigError(f"{path} is over {max_bytes} bytes; save the run again")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"cannot read {path} ({err.__class__.__name__}); save the run again") from None


def read_adapter_config(path: Path) -> dict[str, Any]:
    """``adapter_config.json`` as a dict (its size bounded; a one-line ConfigError when it is not a JSON object)."""
    data = read_bounded_json(path, MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; save the run again")
    return data


def _names(path: Path, key: str, value: Any) -> list[str]:
    """``value`` as a list of plain module names (None: []), else a one-line ConfigError."""
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) and NAME.fullmatch(v) for v in value):
        return list(value)
    raise ConfigError(
        f"{path}: {key}={str(value)[:60]!r} is not a list of module names; generate matches names only, never a "
        "pattern: list the module names (e.g. [c_attn, c_proj])"
    )


def _number(path: Path, key: str, value: Any, least: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < least:
        raise ConfigError(f"{path}: {key}={str(value)[:40]!r} must be a number >= {least:g}; save the run again")
    return float(value)


def _widths(base: Any, targets: list[str]) -> dict[str, int]:
    """{module name: the smaller side of its 2-D weight} of the base's modules a target names (name or suffix)."""
    out = {}
    for name, module in base.named_modules():
        weight = getattr(module, "weight", None)
        named = any(name == t or name.endswith(f".{t}") for t in targets)
        if named and weight is not None and weight.dim() == 2:
            out[name] = int(min(weight.shape))
    return out


def _check_rank(path: Path, key: str, value: Any, widths: dict[str, int]) -> None:
    """``value`` is an integer rank from 1 to the narrowest adapted layer's smaller side."""
    limit = min(widths.values())
    if not (type(value) is int and 1 <= value <= limit):
        narrowest = min(widths, key=lambda n: widths[n])
        raise ConfigError(
            f"{path}: {key}={str(value)[:40]} must be an integer from 1 to {limit} (the rank is at most the smaller "
            f"side of the layer it adapts, {narrowest}); save the run again"
        )


def check_adapter_config(path: Path, saved: dict[str, Any], base: Any) -> None:
    """The adapter config ``saved`` (read from ``path``) fits ``base``: plain names, bounded ranks, finite alphas."""
    targets = _names(path, "target_modules", saved.get("target_modules"))
    for key in _PATTERN_KEYS:
        value = saved.get(key)
        _names(path, key, [value] if isinstance(value, str) else value)
    widths = _widths(base, targets)
    if not widths:
        raise ConfigError(f"{path}: target_modules={targets} names no layer of the base model; save the run again")
    _check_rank(path, "r", saved.get("r"), widths)
    _number(path, "lora_alpha", saved.get("lora_alpha"), 0)
    for key in _RANK_MAPS:
        patterns = saved.get(key) or {}
        if not isinstance(patterns, dict):
            raise ConfigError(f"{path}: {key} must be a mapping of module names; save the run again")
        _names(path, key, list(patterns))
        for name, value in patterns.items():
            if key == "rank_pattern":
                _check_rank(path, f"{key}[{name}]", value, widths)
            else:
                _number(path, f"{key}[{name}]", value, 0)
