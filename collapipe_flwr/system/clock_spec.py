"""The ``clock`` config section: which clock a run's time is read on (docs/testbed.md "The virtual clock").

``wall`` (the default): the run's round times are the seconds it took on this machine. ``virtual``: they are the
virtual clock's (``pipeline/virtual_clock.py``): each device's measured CPU seconds scaled by host speed / its
speed, hand-overs and the uplink from their bytes at the modelled rates; computed per round and never waited for,
so nothing emulates a slow device or link (the testbed and ``runtime.emulate`` are refused with it). Every run
records the virtual clock beside the wall clock in rounds.jsonl; the mode says which one its summary and
progress lines, and time to target, read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.spec_parsing import choices, require, typed


class ClockMode(StrEnum):
    """``clock.mode``: which clock a run's times are read on."""

    WALL = "wall"
    VIRTUAL = "virtual"


@dataclass(frozen=True)
class ClockSpec:
    """mode: ``wall`` | ``virtual``; host_flops: the host's FLOP rate the devices' speeds are set against
    (FLOP/s of one thread on one TEB's forward + backward); 0 = measured by the server at start."""

    mode: ClockMode = ClockMode.WALL
    host_flops: float = 0.0

    def __post_init__(self) -> None:
        choices(self, "clock", mode=ClockMode)
        require(self.host_flops >= 0, f"clock.host_flops={self.host_flops} must be >= 0 (0 = measured at start)")

    @property
    def virtual(self) -> bool:
        return self.mode is ClockMode.VIRTUAL

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


def parse_clock(raw: Any) -> ClockSpec:
    return typed("clock", ClockSpec, raw)
