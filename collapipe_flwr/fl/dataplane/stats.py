"""Counters the decoder host keeps per cluster n, for tests and the per-round JSON log, and the order in
which the head ran the served steps."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sized
from dataclasses import asdict, dataclass
from typing import NamedTuple


@dataclass
class ClusterCounters:
    steps: int = 0  # step requests served (head updated)
    refused: int = 0  # step requests refused with an error frame
    bytes_in: int = 0  # request frame bytes received
    bytes_out: int = 0  # reply/error frame bytes sent
    seconds_head: float = 0.0  # time inside head_step (forward, backward, optimizer step)
    seconds_wait: float = 0.0  # time waiting for the decoder lock (other CUs' steps; ordered: and its turn)
    seconds_total: float = 0.0  # time from frame received to reply encoded
    cpu_head: float = 0.0  # CPU seconds of the thread that ran head_step (the virtual clock's server decoder time)

    def to_dict(self) -> dict:
        return asdict(self)


class ServedSeconds(NamedTuple):
    """One frame's seconds: inside head_step (``head``), waiting for the decoder's lock (``wait``), from frame
    received to reply encoded (``total``), and the CPU seconds of the thread that ran head_step (``cpu``)."""

    head: float = 0.0
    wait: float = 0.0
    total: float = 0.0
    cpu: float = 0.0


NO_SECONDS = ServedSeconds()


class HostCounters:
    """:class:`ClusterCounters` per cluster n, one for frames without a valid header (``unattributed``),
    and (t, n, seq) of every served step in the order the head ran them (the last ``keep_order``).

    Guarded by ``state_lock``, the host's lock for its bookkeeping (shared with the stream registry and
    the replay guard); :attr:`unattributed` may be changed directly only while holding it.
    """

    def __init__(self, state_lock: threading.Lock, keep_order: int = 100_000) -> None:
        self._state_lock = state_lock
        self._counters: dict[int, ClusterCounters] = collections.defaultdict(ClusterCounters)
        self.unattributed = ClusterCounters()
        self._order: collections.deque = collections.deque(maxlen=keep_order)

    @property
    def state_lock(self) -> threading.Lock:
        """The host's bookkeeping lock these counters are guarded by (the replay guard's step ids share it)."""
        return self._state_lock

    def count(
        self,
        cluster: int | None,
        frame: Sized,
        reply: Sized,
        served: bool,
        seconds: ServedSeconds = NO_SECONDS,
        whole: bool = True,
    ) -> None:
        """One request frame answered by ``reply`` (a served step or a refusal) for cluster n (None: unknown), with
        its ``seconds``; ``whole=False``: a served 1F1B part before the step's last (counted as a step with its last
        part)."""
        with self._state_lock:
            c = self._counters[cluster] if cluster is not None else self.unattributed
            c.steps += int(served and whole)
            c.refused += int(not served)
            c.bytes_in += len(frame)
            c.bytes_out += len(reply)
            c.seconds_head += seconds.head
            c.seconds_wait += seconds.wait
            c.seconds_total += seconds.total
            c.cpu_head += seconds.cpu

    def refuse_unattributed(self) -> None:
        """One stream or frame refused before its cluster was known (e.g. a wrong key in its metadata)."""
        with self._state_lock:
            self.unattributed.refused += 1

    def served(self, round_: int, cluster: int, seq: int) -> None:
        """The head ran step ``seq`` of cluster n in round t (called under the decoder's lock)."""
        with self._state_lock:
            self._order.append((round_, cluster, seq))

    def stats(self) -> dict:
        """{"clusters": {n: counters}, "unattributed": counters for frames without a valid header}."""
        with self._state_lock:
            return {
                "clusters": {n: c.to_dict() for n, c in sorted(self._counters.items())},
                "unattributed": self.unattributed.to_dict(),
            }

    def served_order(self) -> list[tuple[int, int, int]]:
        """(round, cluster, seq) of every served step, in the order the head ran them."""
        with self._state_lock:
            return list(self._order)
