"""``federation.decoder_update: ordered``: Algorithm 1, line 14 per CU (one decoder update per CU step, as
``per_cu``), but applied in cluster order instead of arrival order, so two runs with the same seed give the
same decoder.

The order of round t is step 1 of every participating cluster in cluster order (n_1 < n_2 < ...), then step 2
in the same order, and so on. A turnstile, not a barrier: the request for step ``seq`` of cluster n waits only
until every slot ordered before it is resolved, i.e. step ``seq`` of every participating cluster below n and
step ``seq - 1`` of every one above it. A slot is resolved once its step has run (served, or refused inside its
turn, which leaves the head untouched), was skipped, or its cluster left the order:

- skipped: a step refused after its step id was claimed (bad shape or values) can never come again (step ids
  rise strictly), so :meth:`OrderedSteps.skip` resolves its slot; a request for step ``seq`` also resolves its
  cluster's unused earlier slots. A refusal before the claim (wrong key, closed round, undecodable frame)
  touches nothing: the order stays as if that frame had not come, and the CU may send the step again.
- left (:meth:`OrderedSteps.leave`): the cluster's stream ended cleanly, which a CU's client does once it has
  sent its last step of the round (its round finished, early or not, or failed on the CU): no slot of it is
  waited for again.
- dropped: a cluster that a waiting request needs and that has sent nothing (no request pending) for
  ``timeout_s`` (the data plane's lock timeout, as :mod:`.joint` uses) is left out for the rest of the round,
  logged once, so a stuck or vanished CU never deadlocks the others.

A cluster that left or was dropped and still sends a step is served in arrival order, like ``per_cu``.
Progress: the first unresolved slot's cluster either has that step pending, which may then run, or has nothing
pending and is dropped after ``timeout_s``, so some request always moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from collapipe_flwr.errors import DataPlaneError

log = logging.getLogger(__name__)


class OrderedSteps:
    """The turnstile of one round at a time: ``with turn(request) as in_order:`` waits for the request's turn
    (``in_order`` False: its cluster is out of the order, serve it at once) and, on leaving the block, marks
    the slot resolved, whatever happened inside it. ``clock`` is the monotonic time source (tests)."""

    def __init__(self, timeout_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = float(timeout_s)
        self._clock = clock
        self._cv = threading.Condition()
        self._round: int | None = None
        self._order: tuple[int, ...] = ()
        self._out: dict[int, str] = {}  # cluster -> why it is out of the order ("left" | "dropped")
        self._done: dict[int, int] = {}  # cluster -> highest resolved step seq
        self._pending: dict[int, set[int]] = {}  # cluster -> steps in the turnstile or running
        self._seen: dict[int, float] = {}  # cluster -> when it last sent a step or had one resolved

    # -- rounds ------------------------------------------------------------------------------------
    def open_round(self, round_: int, clusters) -> None:
        with self._cv:
            now = self._clock()
            self._round, self._order = int(round_), tuple(sorted({int(c) for c in clusters}))
            self._out.clear()
            self._done = dict.fromkeys(self._order, 0)
            self._pending = {c: set() for c in self._order}
            self._seen = dict.fromkeys(self._order, now)
            self._cv.notify_all()

    def close_round(self) -> None:
        """Every request still waiting for its turn is refused with a one-line error."""
        with self._cv:
            self._round = None
            self._cv.notify_all()

    @property
    def dropped(self) -> set[int]:
        """Clusters left out for sending nothing within the timeout."""
        with self._cv:
            return {c for c, why in self._out.items() if why == "dropped"}

    @property
    def left(self) -> set[int]:
        """Clusters whose stream ended cleanly (their steps of the round are over)."""
        with self._cv:
            return {c for c, why in self._out.items() if why == "left"}

    # -- slots -------------------------------------------------------------------------------------
    def skip(self, round_: int, cluster: int, seq: int) -> None:
        """Step ``seq`` of the cluster was refused after its id was claimed: it will never run, so its slot
        is resolved (the order goes on as if the cluster had no such step)."""
        with self._cv:
            if self._tracks(round_, cluster):
                self._resolve(int(cluster), int(seq))

    def leave(self, round_: int, cluster: int) -> None:
        """The cluster sends no more steps this round (its stream ended cleanly): no slot of it is awaited."""
        with self._cv:
            if self._tracks(round_, cluster) and int(cluster) not in self._out:
                self._out[int(cluster)] = "left"
                log.debug("ordered decoder update: cluster %s left the order of round %s", cluster, round_)
                self._cv.notify_all()

    @contextmanager
    def turn(self, request) -> Iterator[bool]:
        """Wait for the turn of step ``request.seq`` of ``request.cluster`` in round ``request.round``; yields
        whether it ran in order. The slot is resolved when the block exits (normally or by an exception)."""
        cluster, seq = int(request.cluster), int(request.seq)
        with self._cv:
            in_order = self._tracks(request.round, cluster) and cluster not in self._out
            if in_order:
                self._arrive(cluster, seq)
                try:
                    self._wait_for_turn(int(request.round), cluster, seq)
                except BaseException:
                    if self._tracks(request.round, cluster):
                        self._resolve(cluster, seq)
                    raise
        try:
            yield in_order
        finally:
            if in_order:
                with self._cv:
                    if self._tracks(request.round, cluster):
                        self._resolve(cluster, seq)

    # -- inside the condition ----------------------------------------------------------------------
    def _tracks(self, round_: int, cluster: int) -> bool:
        return self._round is not None and int(round_) == self._round and int(cluster) in self._done

    def _arrive(self, cluster: int, seq: int) -> None:
        self._pending[cluster].add(seq)
        self._done[cluster] = max(self._done[cluster], seq - 1)  # its unused earlier slots will never come
        self._seen[cluster] = self._clock()
        self._cv.notify_all()

    def _resolve(self, cluster: int, seq: int) -> None:
        self._pending[cluster].discard(seq)
        self._done[cluster] = max(self._done[cluster], seq)
        self._seen[cluster] = self._clock()
        self._cv.notify_all()

    def _blockers(self, cluster: int, seq: int) -> list[int]:
        """Clusters in the order whose slot before (seq, cluster) is not resolved yet."""
        return [
            c
            for c in self._order
            if c != cluster and c not in self._out and self._done[c] < (seq if c < cluster else seq - 1)
        ]

    def _wait_for_turn(self, round_: int, cluster: int, seq: int) -> None:
        while True:
            if self._round != round_:
                raise DataPlaneError(
                    f"round {round_} closed while step {seq} of cluster {cluster} waited for its turn in cluster order"
                )
            blockers = self._blockers(cluster, seq)
            if not blockers:
                return
            now, wake = self._clock(), self._timeout_s
            for c in blockers:
                if self._pending[c]:
                    continue  # present: its own step is waiting or running
                idle = now - self._seen[c]
                if idle >= self._timeout_s:
                    self._out[c] = "dropped"
                    log.warning(
                        "ordered decoder update: cluster %s sent no step for %.3g s (the data plane's lock "
                        "timeout); left out of the cluster order for the rest of round %s",
                        c,
                        idle,
                        round_,
                    )
                    self._cv.notify_all()
                else:
                    wake = min(wake, self._timeout_s - idle)
            if all(c in self._out for c in blockers):
                continue
            self._cv.wait(timeout=max(0.01, wake))
