"""The measured wall seconds of one GPipe step on the CU (``ClusterPipeline.train_step``, Fig. 2 steps 3-6).

A CU reports each phase summed over its round's local steps as the metric ``seconds-step-<phase>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

PHASES = ("embed", "forward", "head", "backward", "update", "total")


class CallCpu(NamedTuple):
    """One call a stage ran in a step, for the virtual clock (``pipeline/virtual_clock.py``): ``kind`` "F"
    (forward), "B" (backward) or "U" (the optimizer update), its ``micro_batch`` i (-1 for "U"), ``cpu_s`` the CPU
    seconds of the thread that ran it (``time.thread_time``: the host's work on it, not the time a busy host or an
    emulated slowdown kept it waiting) and ``bytes_out`` what it handed on (z^s forward, g^s back; 0 for "U")."""

    kind: str
    micro_batch: int
    cpu_s: float
    bytes_out: int = 0


class StageSeconds(NamedTuple):
    """What one stage measured in one step (``Stage.step``): ``compute``, the seconds of its forwards and
    backwards (emulated slowdown included: eq. 12's on-device time); ``link``, the seconds its outgoing D2D link
    held what it handed on (the testbed's token bucket at r_k^dd plus tau_0 per transfer: eq. 13's hand-over
    time; 0 on an unthrottled host); ``cpu``, the CPU seconds its own process spent from the step's start to this
    update, every thread counted (its compute, and also its share of Ray's call handling and the hand-overs' reads
    and writes): beside ``compute`` (wall seconds) it shows a device descheduled by a busy host (compute > cpu) or
    spending CPU outside its forwards and backwards (cpu > compute); 0 for a stage in the CU's own process (local
    backend), where that process's CPU is the CU's too; ``calls``, each forward, backward and the update with the
    CPU seconds of its own thread (:class:`CallCpu`, in every backend: the virtual clock's input)."""

    compute: float
    link: float = 0.0
    cpu: float = 0.0
    calls: tuple[CallCpu, ...] = ()


@dataclass(frozen=True)
class StepTimings:
    """Seconds of one step's phases, measured on the CU.

    ``embed``: the embedding of the m micro-batches (inside ``forward``); ``forward``: the GPipe forward
    over the S stages up to z^enc of every micro-batch; ``head``: the head (server decoder or local);
    ``backward``: the GPipe backward into the embedding; ``update``: every optimizer step; ``total``: the
    whole step. ``device_compute``: {device k: its stage's compute seconds this step (emulated slowdown
    included)}; ``device_link``: {device k: the seconds its D2D link held its hand-overs this step};
    ``device_cpu``: {device k: its process's CPU seconds this step (``StageSeconds.cpu``)}; ``device_calls``:
    {device k: its calls with their thread CPU seconds (``StageSeconds.calls``)}, in stage order; ``cu_cpu``: the
    CPU seconds of the CU's embedding (forwards, backwards, update) and ``head_cpu`` of a head the CU trains
    itself (``LocalHead``), on the CU's thread.
    """

    embed: float
    forward: float
    head: float
    backward: float
    update: float
    total: float
    device_compute: Mapping[int, float] = field(default_factory=dict)
    device_link: Mapping[int, float] = field(default_factory=dict)
    device_cpu: Mapping[int, float] = field(default_factory=dict)
    device_calls: Mapping[int, tuple[CallCpu, ...]] = field(default_factory=dict)
    cu_cpu: float = 0.0
    head_cpu: float = 0.0

    def phases(self) -> dict[str, float]:
        """{phase: seconds} for the six phases, in ``PHASES`` order (the ``seconds-step-*`` metrics)."""
        return {name: float(getattr(self, name)) for name in PHASES}


@dataclass(frozen=True)
class StepResult:
    """One step: the plain model's mean loss, its number of targets, and the measured phase seconds."""

    loss: float
    count: int
    timings: StepTimings
