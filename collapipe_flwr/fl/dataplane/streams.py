"""The decoder host's open CU streams: how many each (t, n) holds, which round each serves, and when each
last went idle, with the reaper thread that cancels a stream idle for longer than ``idle_timeout_s``."""

from __future__ import annotations

import collections
import math
import threading
import time

from collapipe_flwr.fl.dataplane.backend import Cancellable
from collapipe_flwr.fl.dataplane.stats import HostCounters

MAX_STREAMS_PER_CLUSTER = 4  # open data-plane streams one (round, cluster) key may hold at once


class StreamRegistry:
    """Open streams by their transport's handle (a gRPC context, a socket connection: anything with
    ``cancel()``), guarded by the host's ``state_lock`` (shared with ``counters``).

    Each (t, n) may hold ``max_per_cluster`` streams at once (a CU needs one; a reopened one may overlap
    the old). A stream's idle clock runs from its opening or its last accepted step; the reaper cancels
    it after ``idle_timeout_s`` (the CU's client opens a fresh one on its next step).
    """

    def __init__(
        self, state_lock: threading.Lock, counters: HostCounters, max_per_cluster: int, idle_timeout_s: float
    ) -> None:
        self._state_lock = state_lock
        self._counters = counters
        self.max_per_cluster = max_per_cluster
        self._idle_timeout_s = float(idle_timeout_s)
        self._by_round: dict[int, set] = collections.defaultdict(set)
        # open stream's context -> when it last went idle (inf: busy)
        self._idle_since: dict[Cancellable, float] = {}
        self._last_accepted: dict[Cancellable, float] = {}  # when the stream last had a step accepted
        self._open_per_cluster: collections.Counter = collections.Counter()
        self._reaper_stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.idle_cancelled = 0  # streams cancelled for idling (a counter for tests and logs)

    # -- one stream --------------------------------------------------------------------------------
    def open(self, stream: tuple[int, int] | None) -> bool:
        """Count a new stream of (t, n); False when that cluster already holds its share of the host's streams
        (one key holder must not fill ``max_streams`` and lock every other CU out)."""
        if stream is None:
            return True
        with self._state_lock:
            if self._open_per_cluster[stream] >= self.max_per_cluster:
                self._counters.unattributed.refused += 1
                return False
            self._open_per_cluster[stream] += 1
            return True

    def register(self, round_: int, context: Cancellable) -> None:
        """The stream serves round t: :meth:`cancel_round` ends it."""
        with self._state_lock:
            self._by_round[round_].add(context)

    def mark_idle(self, context: Cancellable, busy: bool = False, refused: bool = False) -> None:
        """Idle since now, or busy (inf). Only an accepted step (or the stream's opening) starts the idle clock
        afresh: after a refused frame the stream is idle since its last accepted step, so a CU sending junk
        every few seconds is still reaped after ``idle_timeout_s``."""
        with self._state_lock:
            now = time.monotonic()
            if busy:
                self._last_accepted.setdefault(context, self._idle_since.get(context, now))
                self._idle_since[context] = math.inf
            elif refused:
                self._idle_since[context] = self._last_accepted.get(context, now)
            else:
                self._idle_since[context] = now
                self._last_accepted[context] = now

    def release(self, context: Cancellable, registered: int | None, stream: tuple[int, int] | None) -> None:
        """The stream ended: forget its clocks, its round (``registered``) and its share of (t, n)."""
        with self._state_lock:
            self._idle_since.pop(context, None)
            self._last_accepted.pop(context, None)
            if registered is not None:
                self._by_round.get(registered, set()).discard(context)
            if stream is not None:
                self._open_per_cluster[stream] -= 1
                if self._open_per_cluster[stream] <= 0:
                    del self._open_per_cluster[stream]

    def cancel_round(self, round_: int) -> None:
        """Cancel every stream registered for round t."""
        with self._state_lock:
            contexts = list(self._by_round.pop(round_, ()))
        for context in contexts:
            context.cancel()

    # -- the reaper --------------------------------------------------------------------------------
    def start_reaper(self) -> None:
        self._reaper_stop.clear()
        self._reaper = threading.Thread(target=self._reap_idle_streams, name="decoder-host-reaper", daemon=True)
        self._reaper.start()

    def stop_reaper(self) -> None:
        self._reaper_stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5.0)
            self._reaper = None

    def _reap_idle_streams(self) -> None:
        """Cancel every stream idle for longer than ``idle_timeout_s`` (runs until :meth:`stop_reaper`)."""
        period = min(1.0, self._idle_timeout_s / 4)
        while not self._reaper_stop.wait(period):
            now = time.monotonic()
            with self._state_lock:
                stale = [c for c, since in self._idle_since.items() if now - since > self._idle_timeout_s]
                for context in stale:
                    self._idle_since.pop(context, None)
            for context in stale:
                context.cancel()  # before counting it: whoever reads the counter sees the stream already cancelled
                self.idle_cancelled += 1
