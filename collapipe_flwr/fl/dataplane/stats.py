"""Counters the decoder host keeps per cluster n, for tests and the per-round JSON log."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ClusterCounters:
    steps: int = 0  # step requests served (head updated)
    refused: int = 0  # step requests refused with an error frame
    bytes_in: int = 0  # request frame bytes received
    bytes_out: int = 0  # reply/error frame bytes sent
    seconds_head: float = 0.0  # time inside head_step (forward, backward, optimizer step)
    seconds_wait: float = 0.0  # time waiting for the decoder lock (other CUs' steps)
    seconds_total: float = 0.0  # time from frame received to reply encoded

    def to_dict(self) -> dict:
        return asdict(self)
