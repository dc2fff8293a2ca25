"""Learning-rate warm-up and decay, as a multiplier of the optimizer's lr (model.schedule).

``warmup_steps`` w: linear ramp lr * s / w for step s < w. ``decay``:
- ``none``: constant lr after warm-up;
- ``inverse_sqrt``: lr * sqrt(w / s) after warm-up (Vaswani et al.'s shape);
- ``linear``: lr * (1 - s / total_steps) after warm-up, to 0 at ``total_steps``;
- ``cosine``: lr * 0.5 (1 + cos(pi s / total_steps)) after warm-up.
Pure function of the step, so every holder of a segment (CU, devices, server) applies the same factor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from collapipe_flwr.errors import ConfigError

DECAYS = ("none", "inverse_sqrt", "linear", "cosine")


def validate_schedule(schedule: Mapping[str, Any]) -> None:
    unknown = sorted(set(schedule) - {"warmup_steps", "decay", "total_steps", "min_factor"})
    if unknown:
        raise ConfigError(f"unknown config key model.schedule.{unknown[0]}; valid keys are decay, min_factor, total_steps, warmup_steps")
    warmup = schedule.get("warmup_steps", 0)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"model.schedule.warmup_steps={warmup!r} must be an integer >= 0")
    decay = schedule.get("decay", "none")
    if decay not in DECAYS:
        raise ConfigError(f"model.schedule.decay={decay!r} is not one of {', '.join(DECAYS)}")
    total = schedule.get("total_steps", 0)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ConfigError(f"model.schedule.total_steps={total!r} must be an integer >= 0 (0 = set by the trainer)")
    floor = schedule.get("min_factor", 0.0)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor <= 1:
        raise ConfigError(f"model.schedule.min_factor={floor!r} must be in [0, 1]")


def lr_factor(step: int, warmup_steps: int = 0, decay: str = "none", total_steps: int = 0, min_factor: float = 0.0) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    s = step + 1
    if warmup_steps and s < warmup_steps:
        return s / warmup_steps
    if decay == "none":
        factor = 1.0
    elif decay == "inverse_sqrt":
        factor = math.sqrt(max(warmup_steps, 1) / s)
    elif total_steps <= 0:
        factor = 1.0
    else:
        progress = min(1.0, max(0.0, (s - warmup_steps) / max(1, total_steps - warmup_steps)))
        factor = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(min_factor, factor)
