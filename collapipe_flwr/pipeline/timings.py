"""The measured wall seconds of one GPipe step on the CU (``ClusterPipeline.train_step``, Fig. 2 steps 3-6).

A CU reports each phase summed over its round's local steps as the metric ``seconds-step-<phase>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PHASES = ("embed", "forward", "head", "backward", "update", "total")


@dataclass(frozen=True)
class StepTimings:
    """Seconds of one step's phases, measured on the CU.

    ``embed``: the embedding of the m micro-batches (inside ``forward``); ``forward``: the GPipe forward
    over the S stages up to z^enc of every micro-batch; ``head``: the head (server decoder or local);
    ``backward``: the GPipe backward into the embedding; ``update``: every optimizer step; ``total``: the
    whole step. ``device_compute``: {device k: its stage's compute seconds this step (emulated slowdown
    included)}.
    """

    embed: float
    forward: float
    head: float
    backward: float
    update: float
    total: float
    device_compute: Mapping[int, float] = field(default_factory=dict)

    def phases(self) -> dict[str, float]:
        """{phase: seconds} for the six phases, in ``PHASES`` order (the ``seconds-step-*`` metrics)."""
        return {name: float(getattr(self, name)) for name in PHASES}


@dataclass(frozen=True)
class StepResult:
    """One step: the plain model's mean loss, its number of targets, and the measured phase seconds."""

    loss: float
    count: int
    timings: StepTimings
