"""Which steps the decoder host accepts: those of the open round t from the clusters selected in it
(:class:`RoundGate`), with step ids rising strictly per (t, n) (:class:`StepIds`, the replay guard). A 1F1B
step travels as m parts: its id is (seq, part), and a whole-step frame of m micro-batches counts as (seq, m)."""

from __future__ import annotations

import threading

from collapipe_flwr.errors import DataPlaneError


class RoundGate:
    """The open round t and its selected clusters, and the rounds closed so far.

    Changed only under the decoder's lock; :meth:`check` is called both without it (an early refusal)
    and again under it (the authoritative one), so a closed round runs no step after :meth:`close`.
    """

    def __init__(self) -> None:
        self.round: int | None = None
        self.clusters: frozenset[int] = frozenset()
        self.closed: set[int] = set()

    def open(self, round_: int, clusters: list[int]) -> None:
        self.round = int(round_)
        self.clusters = frozenset(int(c) for c in clusters)
        self.closed.discard(self.round)

    def close(self) -> int | None:
        """Close the open round; returns it (None when no round was open)."""
        if self.round is None:
            return None
        closed, self.round, self.clusters = self.round, None, frozenset()
        self.closed.add(closed)
        return closed

    def check(self, round_: int, cluster: int) -> None:
        """Raise unless round t is open and cluster n is selected in it."""
        if self.round != round_:
            state = "is closed" if round_ in self.closed else "is not open"
            now = f"round {self.round} is open" if self.round is not None else "no round is open"
            raise DataPlaneError(
                f"round {round_} {state} on the decoder host ({now}); the CU must use the current round's train message"
            )
        if cluster not in self.clusters:
            raise DataPlaneError(
                f"cluster {cluster} is not selected in round {round_} (selected: {sorted(self.clusters)}); only the "
                "round's chosen CUs may send steps"
            )


class StepIds:
    """The highest step id (seq, part) claimed per (round t, cluster n), guarded by the host's ``state_lock``."""

    def __init__(self, state_lock: threading.Lock) -> None:
        self._state_lock = state_lock
        self.last: dict[tuple[int, int], tuple[int, int]] = {}

    def claim(self, round_: int, cluster: int, seq: int, part: int = 0) -> None:
        """Step ids (seq, part) increase strictly per (round, cluster), compared as pairs: a replayed or reordered
        frame is refused. ``part`` is micro-batch i of a 1F1B step (its parts 0, 1, .. m-1 share one seq); a
        whole step of m micro-batches claims (seq, m), so none of its micro-batches can come again as a part."""
        key = (int(seq), int(part))
        with self._state_lock:
            last = self.last.get((round_, cluster), (0, 0))
            if key <= last:
                what = f"{seq}" if not part else f"{seq} (part {part})"
                raise DataPlaneError(
                    f"step id {what} of cluster {cluster} in round {round_} is not above the last one ({last[0]}): a "
                    "replayed or reordered frame; a CU numbers its steps 1, 2, ... within a round"
                )
            self.last[(round_, cluster)] = key

    def keep_round(self, round_: int) -> None:
        """Forget every round but t: only the open round's step ids can be claimed (O(N), not O(N * T))."""
        with self._state_lock:
            self.last = {key: ids for key, ids in self.last.items() if key[0] == round_}
