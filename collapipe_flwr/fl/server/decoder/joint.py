"""Algorithm 1, line 14 as written: one decoder update per step on the activations of all clusters.

With ``federation.decoder_update: joint`` the decoder host does not update the decoder once per CU step in
arrival order; it gathers step ``seq`` of round t from every participating cluster (a barrier across CUs),
runs ONE head step on the concatenation of their micro-batches (loss = the mean over all clusters'
targets) and answers each CU with the gradients of its own micro-batches, rescaled to its own mean loss
(x C / C_n), so a CU's encoder sees the same gradient scale in both modes.

A cluster that does not reach the barrier within ``timeout_s`` is left out of the barrier for the rest of
the round (the others go on without it); its later steps are then served alone, as in the per-CU mode.
:meth:`JointSteps.close_round` fails every gather still open with a one-line error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from collapipe_flwr.errors import DataPlaneError

StepResults = dict[int, tuple[float, list[torch.Tensor]]]  # cluster -> (its loss, its dL/dz_enc per micro-batch)


@dataclass
class _Gather:
    requests: dict[int, object] = field(default_factory=dict)
    running: bool = False
    results: StepResults | None = None
    error: Exception | None = None
    taken: set[int] = field(default_factory=set)


class JointSteps:
    """The barrier: ``submit(request)`` blocks until the joint step that includes it has run.

    ``run_step(requests)`` performs the joint step (under the decoder's lock) and returns
    :data:`StepResults`; it is called by exactly one of the waiting threads, outside the barrier's lock.
    ``submit`` returns None when the request's cluster was left out of the barrier (serve it alone).
    """

    def __init__(self, run_step: Callable[[list], StepResults], timeout_s: float = 120.0) -> None:
        self._run_step = run_step
        self._timeout_s = float(timeout_s)
        self._cv = threading.Condition()
        self._round: int | None = None
        self._expected: frozenset[int] = frozenset()
        self._dropped: set[int] = set()
        self._gathers: dict[tuple[int, int], _Gather] = {}

    def open_round(self, round_: int, clusters) -> None:
        with self._cv:
            self._round, self._expected, self._dropped = int(round_), frozenset(int(c) for c in clusters), set()
            self._gathers.clear()

    def close_round(self) -> None:
        with self._cv:
            for gather in self._gathers.values():
                if gather.results is None and gather.error is None:
                    gather.error = DataPlaneError("the round closed before every cluster sent this step")
            self._round = None
            self._cv.notify_all()

    @property
    def dropped(self) -> set[int]:
        with self._cv:
            return set(self._dropped)

    def submit(self, request) -> tuple[float, list[torch.Tensor]] | None:
        cluster, key = int(request.cluster), (int(request.round), int(request.seq))
        with self._cv:
            if cluster in self._dropped or request.round != self._round:
                return None
            gather = self._gathers.setdefault(key, _Gather())
            if cluster in gather.requests or gather.running or gather.results is not None:
                raise DataPlaneError(
                    f"step {request.seq} of cluster {cluster} arrived twice or too late for its joint step"
                )
            gather.requests[cluster] = request
            deadline = time.monotonic() + self._timeout_s
            leader = False
            while gather.results is None and gather.error is None:
                missing = self._expected - self._dropped - set(gather.requests)
                if not gather.running and (not missing or time.monotonic() >= deadline):
                    self._dropped |= missing  # late clusters leave the barrier for the rest of the round
                    gather.running = leader = True
                    break
                self._cv.wait(timeout=max(0.01, deadline - time.monotonic()) if not gather.running else 1.0)
        if leader:
            results, error = None, None
            try:
                results = self._run_step([gather.requests[c] for c in sorted(gather.requests)])
            except Exception as err:  # noqa: BLE001 - every waiting CU gets the same one-line refusal
                error = err
            with self._cv:
                gather.results, gather.error = results, error
                self._cv.notify_all()
        with self._cv:
            gather.taken.add(cluster)
            if gather.taken >= set(gather.requests):
                self._gathers.pop(key, None)
            if gather.error is not None:
                raise gather.error
            if gather.results is None:  # unreachable: the step's runner sets results or error before notifying
                raise DataPlaneError(f"cluster {cluster}'s joint step ended without results")
            return gather.results[cluster]
