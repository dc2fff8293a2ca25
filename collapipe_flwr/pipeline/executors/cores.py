"""Which CPU cores and how many torch threads a device actor gets (``runtime.pin_threads``)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from collapipe_flwr.pipeline.runtime_spec import PinThreads
from collapipe_flwr.spec_parsing import choice


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset / container CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores_list() -> list[int]:
    """The CPU core numbers this process may run on (all of them where affinity is not available)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def default_actor_threads(S: int) -> int:
    """Torch threads per device actor: the usable cores minus one for the CU process, shared by the S
    actors, at least 1. Oversubscribing cores hurts torch's OpenMP pool far more than leaving one idle
    (see benchmarks/pipeline_overhead.py and its ``--actor-threads`` option)."""
    return max(1, (usable_cores() - 1) // max(1, S))


def core_sets(cores: Sequence[int], S: int, mode: str = "auto") -> list[tuple[int, ...]] | None:
    """The CPU cores each of the S device actors of one host is pinned to (``runtime.pin_threads``), or None.

    ``auto``: disjoint sets when there are at least S cores: the first core is left to the CU (which
    embeds, calls the head and steps the embedding while the devices work) when there are more than S,
    the rest split into S contiguous near-equal sets (the first sets one core larger when they do not
    divide evenly); with fewer cores than stages nothing is pinned. ``true``: as ``auto``, and with fewer
    cores than stages each actor still gets one core, round-robin (so two actors share it). ``false``:
    None (the OS schedules every thread anywhere)."""
    pin = choice("runtime.pin_threads", mode, PinThreads)
    cores = sorted(cores)
    C = len(cores)
    if pin is PinThreads.FALSE or S < 1 or C == 0 or (C < S and pin is PinThreads.AUTO):
        return None
    if C < S:
        return [(cores[s % C],) for s in range(S)]
    rest = cores[1:] if C > S else cores
    size, extra = divmod(len(rest), S)
    sets, a = [], 0
    for s in range(S):
        b = a + size + (1 if s < extra else 0)
        sets.append(tuple(rest[a:b]))
        a = b
    return sets
