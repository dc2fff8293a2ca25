"""Channel matching (Sub-2's matching step, eq. 41) with virtual channels when N > J.

CU n on channel j costs ``cost[n, j]``; a CU left without a real channel (I_{n,j} = 0 for every j, C4
read with the paper's virtual channels) costs ``virtual_cost[n]``. Exactly min(N', J) CUs get a real
channel, N' being the CUs with at least one feasible channel (finite cost); the Hungarian method
(scipy.optimize.linear_sum_assignment) finds the cheapest such matching. With N' > J the N' - J virtual
channels of CU n all cost virtual_cost[n], so the N' x N' problem is the N' x J one on
cost[n, j] - virtual_cost[n] (sum_n virtual_cost[n] plus the matched CUs' differences): the same matching
from J augmenting paths instead of N'.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def match_channels(cost: np.ndarray, virtual_cost: np.ndarray) -> list[int | None]:
    """Channel of each CU (None = sits the round out), minimising the total cost (C3-C5)."""
    cost = np.asarray(cost, dtype=float)
    N, J = cost.shape
    out: list[int | None] = [None] * N
    rows = [n for n in range(N) if np.isfinite(cost[n]).any()]
    if not rows or J == 0:
        return out
    sub = cost[rows]
    n_virtual = max(len(rows) - J, 0)
    sit_out = np.asarray(virtual_cost, dtype=float)[rows]
    try:
        if n_virtual and np.isfinite(sit_out).all():  # J of the N' CUs get a channel: the rectangular form
            r, c = linear_sum_assignment(sub - sit_out[:, None])
        else:
            r, c = linear_sum_assignment(np.hstack([sub, np.repeat(sit_out[:, None], n_virtual, axis=1)]))
    except ValueError:  # finite pairs cannot seat min(N', J) CUs: fewest unmatched first, then cost
        finite = sub[np.isfinite(sub)]
        bonus = 1.0 + np.abs(finite).sum() + np.abs(virtual_cost).sum()
        private = np.full((len(rows), len(rows)), np.inf)
        np.fill_diagonal(private, np.asarray(virtual_cost, dtype=float)[rows])
        big = np.where(np.isfinite(sub), sub - bonus, 1e300)
        r, c = linear_sum_assignment(np.hstack([big, np.where(np.isfinite(private), private, 1e300)]))
    for i, j in zip(r, c):
        if j < J and np.isfinite(sub[i, j]):
            out[rows[i]] = int(j)
    return out
