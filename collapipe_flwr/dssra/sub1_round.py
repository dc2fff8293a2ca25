"""Sub-1 (paper eq. 37) for every cluster of one round, as the block coordinate descent asks for it.

Each BCD pass needs, for every cluster n, Sub-1's plan (S, m, delta_k) given whether n has a channel (an idle
cluster minimises its drift alone). A plan depends only on (n, idle), so each is solved once per round. The
exact solver runs for all the clusters a pass needs at once: their stage tables T*(m, S) (segments.py:
StageTables) are built once per round and serve both the busy and the idle objective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.segments import SegmentPlan, StageTables, solve_tables

# (model, n, idle) -> Sub-1's plan of cluster n: the policy's own rule (uniform blocks, a method's partition)
SolveOne = Callable[[ClusterModel, int, bool], SegmentPlan]


class RoundSub1:
    """Sub-1's plans of one round's clusters, cached by (n, idle).

    exact=True: every plan is the exact Sub-1 (``solve_tables``) with V, ``drift_of(n, K)`` (drift(S) for
    S = 0..K) and ``m_values``; otherwise ``solve_one`` answers cluster by cluster."""

    def __init__(
        self,
        models: Sequence[ClusterModel],
        solve_one: SolveOne,
        exact: bool,
        V: float,
        drift_of: Callable[[int, int], np.ndarray],
        m_values: Sequence[int],
    ) -> None:
        self.models, self.solve_one, self.exact = models, solve_one, exact
        self.V, self.drift_of, self.m_values = V, drift_of, list(m_values)
        self.cache: dict[tuple[int, bool], SegmentPlan] = {}
        self._tables: StageTables | None = None

    def __call__(self, flags: Sequence[bool]) -> list[SegmentPlan]:
        """Sub-1 of every cluster, cluster n busy iff ``flags[n]`` (it has a channel)."""
        keys = [(n, not busy) for n, busy in enumerate(flags)]
        missing = [key for key in keys if key not in self.cache]
        if missing and self.exact:
            self._solve_exact(missing)
        for n, idle in missing:
            if (n, idle) not in self.cache:
                self.cache[(n, idle)] = self.solve_one(self.models[n], n, idle)
        return [self.cache[key] for key in keys]

    def _solve_exact(self, missing: list[tuple[int, bool]]) -> None:
        if self._tables is None:
            self._tables = StageTables.build(self.models, self.m_values, self.V)
        rows = [n for n, _ in missing]
        drift = np.stack([np.asarray(self.drift_of(n, self.models[n].K), dtype=float) for n in rows])
        plans = solve_tables(self._tables, rows, self.V, drift, np.array([idle for _, idle in missing]))
        for key, plan in zip(missing, plans):
            if plan is None:
                raise self.models[key[0]].infeasible(self.m_values)
            self.cache[key] = plan
