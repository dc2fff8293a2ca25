"""The ``clock`` config section: which clock a run's time is read on (docs/testbed.md "The virtual clock").

``wall`` (the default): the run's round times are the seconds it took on this machine. ``virtual``: they are the
virtual clock's (``pipeline/virtual_clock.py``): each device's measured CPU seconds scaled by host speed / its
speed, hand-overs and the uplink from their bytes at the modelled rates; computed per round and never waited for,
so nothing emulates a slow device or link (the testbed and ``runtime.emulate`` are refused with it). Every run
records the virtual clock beside the wall clock in rounds.jsonl; the mode says which one its summary and
progress lines, and time to target, read.

The server's and the CUs' own work (the decoder's head steps, the plan and aggregation, the embedding, a round's
set-up) is measured in CPU seconds of the host too. ``server_flops`` and ``cu_flops`` set them against an edge
server's and a CU's speed, as the devices' are set against theirs: ``x host_flops / server_flops``. Left at 0 they
stay the host's own seconds, and a record then depends on the host that ran it (a host 4x slower per thread made the
decoder's term 4x larger, 2026-11-29).

``host_flops: 0`` measures the host's speed with one probe at the server's start. That one reading's error enters
every device's compute in the run (one start-up read 21.1e9 FLOP/s on a host whose other readings were 24-27e9,
2026-11-30). ``probe_every_round`` takes one more reading at each round's start, before the plan, and sets the
round's devices against the median of every reading so far.
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
    (FLOP/s of one thread on one TEB's forward + backward); 0 = measured by the server at start. server_flops and
    cu_flops: the edge server's and a CU's FLOP rate (the same measure), the server's and the CUs' measured work
    is set against; 0 = the host's own (their terms stay the host's seconds). probe_every_round: with host_flops
    measured, read it again at each round's start and use the median of every reading so far."""

    mode: ClockMode = ClockMode.WALL
    host_flops: float = 0.0
    server_flops: float = 0.0
    cu_flops: float = 0.0
    probe_every_round: bool = False

    def __post_init__(self) -> None:
        choices(self, "clock", mode=ClockMode)
        require(self.host_flops >= 0, f"clock.host_flops={self.host_flops} must be >= 0 (0 = measured at start)")
        for name in ("server_flops", "cu_flops"):
            value = getattr(self, name)
            message = f"clock.{name}={value} must be finite and >= 0 (0 = the host's own speed)"
            require(0 <= value < float("inf"), message)

    def own_work_scale(self, host_flops: float, role: str) -> float:
        """Virtual seconds per host CPU second of the server's (``role="server"``) or a CU's (``"cu"``) own work:
        host_flops / clock.<role>_flops, or 1 (the host's own seconds) when that rate or the host's is unset."""
        rate = self.server_flops if role == "server" else self.cu_flops
        return host_flops / rate if rate > 0 and host_flops > 0 else 1.0

    @property
    def virtual(self) -> bool:
        return self.mode is ClockMode.VIRTUAL

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


def parse_clock(raw: Any) -> ClockSpec:
    return typed("clock", ClockSpec, raw)
