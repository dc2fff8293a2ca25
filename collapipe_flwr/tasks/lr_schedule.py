"""Learning-rate warm-up and decay, as a multiplier of the optimizer's lr (``model.lr_schedule``).

``warmup_steps`` w: linear ramp lr * s / w for step s < w. ``decay``:
- ``none``: constant lr after warm-up;
- ``inverse_sqrt``: lr * sqrt(w / s) after warm-up (Vaswani et al.'s shape);
- ``linear``: lr * (1 - s / total_steps) after warm-up, to 0 at ``total_steps``;
- ``cosine``: lr * 0.5 (1 + cos(pi s / total_steps)) after warm-up.
``min_factor`` floors the multiplier. Pure function of the step, so every holder of a segment (CU,
devices, server) applies the same factor. ("Schedule" alone means the GPipe clock, pipeline/schedule.py.)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.spec_parsing import choices, require, typed


class Decay(StrEnum):
    """``model.lr_schedule.decay``: the lr multiplier's shape after the warm-up (:func:`lr_factor`)."""

    NONE = "none"
    INVERSE_SQRT = "inverse_sqrt"
    LINEAR = "linear"
    COSINE = "cosine"


DECAYS = tuple(Decay)
SECTION = "model.lr_schedule"


@dataclass(frozen=True)
class LrScheduleSpec:
    """``model.lr_schedule``: warm-up steps w, decay shape, total steps (0 = set by the trainer), floor."""

    warmup_steps: int = 0
    decay: Decay = Decay.NONE
    total_steps: int = 0
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        require(self.warmup_steps >= 0, f"{SECTION}.warmup_steps={self.warmup_steps!r} must be an integer >= 0")
        choices(self, SECTION, decay=Decay)
        require(
            self.total_steps >= 0,
            f"{SECTION}.total_steps={self.total_steps!r} must be an integer >= 0 (0 = set by the trainer)",
        )
        require(0 <= self.min_factor <= 1, f"{SECTION}.min_factor={self.min_factor!r} must be in [0, 1]")

    def factor(self, step: int, default_total_steps: int = 0) -> float:
        """Multiplier of the base lr at optimizer step ``step`` (0-based); ``total_steps`` 0 means the
        trainer's ``default_total_steps``."""
        return lr_factor(step, self.warmup_steps, self.decay, self.total_steps or default_total_steps, self.min_factor)

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LrClock:
    """The learning-rate clock of a federated run: round t's i-th local step (0-based) is run-wide step
    ``(t - 1) * local_steps + i`` of ``total_steps`` (T * local_steps unless the schedule sets its own), and
    :meth:`factor` is the multiplier of every base lr at that step: the CU's embedding, every device segment, a
    CU-side head, and the server's decoder (which reads the same clock at the step's sequence number)."""

    schedule: LrScheduleSpec
    local_steps: int
    total_steps: int

    def step(self, round_: int, local_step: int) -> int:
        """The run-wide index of round t's ``local_step``-th step (0-based)."""
        return (int(round_) - 1) * self.local_steps + int(local_step)

    def factor(self, round_: int, local_step: int) -> float:
        """The lr multiplier of round t's ``local_step``-th step."""
        return self.schedule.factor(self.step(round_, local_step), self.total_steps)


def parse_lr_schedule(raw: Any) -> LrScheduleSpec:
    """The ``model.lr_schedule`` mapping (absent = constant lr) as an LrScheduleSpec; one-line ConfigError."""
    return typed(SECTION, LrScheduleSpec, raw)


def lr_factor(
    step: int, warmup_steps: int = 0, decay: str = "none", total_steps: int = 0, min_factor: float = 0.0
) -> float:
    """Multiplier of the base lr at optimizer step ``step`` (0-based)."""
    s = step + 1
    if warmup_steps and s < warmup_steps:
        return s / warmup_steps
    if decay == Decay.NONE:
        factor = 1.0
    elif decay == Decay.INVERSE_SQRT:
        factor = math.sqrt(max(warmup_steps, 1) / s)
    elif total_steps <= 0:
        factor = 1.0
    else:
        progress = min(1.0, max(0.0, (s - warmup_steps) / max(1, total_steps - warmup_steps)))
        factor = 1.0 - progress if decay == Decay.LINEAR else 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(min_factor, factor)
