"""Sub-1 (paper eq. 37, Algorithm 2), solved exactly: devices used, delta_k and m of one cluster.

    min over (S, m, delta)  V * tau_n^pipe(S, m, delta) + drift(S)
    s.t. C1 (sum delta_k = L, delta_k, m integers), C2 (S = #{delta_k > 0}), C7 (memory), C9' (energy)

with tau^pipe = steps (S + m - 1) max_{k: delta_k > 0} (delta_k c_k(m) + d_k(m)) (eq. 15 as read in
system/pipeline_model.py; d_k(m) = c0 + tau_k^dd(m), ClusterModel.chunk_fixed) and drift(S) the queue
term (Y_n S in the paper's P2, Y_n Gamma_n(S) here).

Exactness without a MILP: for fixed m, a stage-time bound T admits a partition on S devices iff the S
devices with the most room u_k(T) = #{delta in 1..cap_k(m): delta c_k + d_k <= T} all have u_k >= 1 and
sum_k u_k >= L (then shrink delta_k from u_k, never below 1, until the sum is L). The optimal T is one
of the K*L chunk times delta c_k + d_k, so sweeping those candidates for every m in 1..m_max gives the
true optimum over all device subsets, all delta and all m. Device order does not matter (footnote 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.errors import InfeasiblePlanError


@dataclass(frozen=True)
class SegmentPlan:
    """Sub-1's answer for one cluster: delta (per device), S, m, the modelled pipeline delay and objective."""

    delta: tuple[int, ...]
    S: int
    m: int
    pipeline_s: float
    objective: float


def partition_for(compute: np.ndarray, d2d: np.ndarray, cap: np.ndarray, L: int, S: int, T: float) -> tuple[int, ...]:
    """A delta on exactly S devices with every chunk <= T (T feasible for S, see min_stage_times)."""
    K = len(compute)
    room = np.array([int(((np.arange(1, cap[k] + 1) * compute[k] + d2d[k]) <= T).sum()) for k in range(K)])
    order = sorted(range(K), key=lambda k: (-room[k], k))[:S]
    delta = np.zeros(K, dtype=int)
    delta[order] = room[order]
    excess = int(delta.sum()) - L
    while excess > 0:  # shave blocks off the slowest stage that keeps >= 1 block
        chunk = np.where(delta > 1, delta * compute + d2d, -np.inf)
        k = int(np.argmax(chunk))
        delta[k] -= 1
        excess -= 1
    return tuple(int(x) for x in delta)


def min_stage_times(compute: np.ndarray, d2d: np.ndarray, cap: np.ndarray, L: int) -> np.ndarray:
    """Vectorised over m: compute, d2d, cap of shape [M, K] -> T*(m, S) of shape [M, K]."""
    M, K = compute.shape
    deltas = np.arange(1, L + 1)
    cand = deltas[None, None, :] * compute[:, :, None] + d2d[:, :, None]  # [M, K, L]
    cand = np.where(deltas[None, None, :] <= cap[:, :, None], cand, np.inf)
    values = cand.reshape(M, K * L)  # [M, C]
    room = (cand[:, None, :, :] <= values[:, :, None, None]).sum(axis=3)  # [M, C, K]
    room = -np.sort(-room, axis=2)
    total = np.cumsum(room, axis=2)
    ok = (room >= 1) & (total >= L) & (np.arange(1, K + 1) <= L)[None, None, :] & np.isfinite(values)[:, :, None]
    return np.where(ok, values[:, :, None], np.inf).min(axis=1)  # [M, K]


def solve_segments(model: ClusterModel, V: float, drift_by_S, m_values, idle: bool = False) -> SegmentPlan:
    """Exact Sub-1 for one cluster. ``drift_by_S[S]`` (S = 0..K) is the queue term; raises
    InfeasiblePlanError (C7 or C9) when no partition fits.

    idle=True: the cluster has no channel this round (BCD, Sub-1 given Sub-2's matching), so its delay does not
    enter the objective: minimise drift(S) alone, ties (the same S) broken by the smallest pipeline delay."""
    L, K = model.num_blocks, model.K
    m_arr = np.asarray(list(m_values), dtype=int)
    drift = np.asarray(drift_by_S, dtype=float)[1 : K + 1]
    compute, d2d, cap = model.compute_per_block(m_arr), model.chunk_fixed(m_arr), model.block_cap(m_arr)
    T = min_stage_times(compute, d2d, cap, L)  # [M, K]
    S_idx = np.arange(1, K + 1)
    pipe = model.steps * (S_idx[None, :] + m_arr[:, None] - 1) * T
    obj = V * pipe + drift[None, :]
    obj = np.where(np.isfinite(T), obj, np.inf)
    if idle and np.isfinite(obj).any():
        best_drift = np.where(np.isfinite(T), drift[None, :], np.inf).min()
        obj = np.where(np.isfinite(T) & (drift[None, :] <= best_drift), pipe, np.inf)
    flat = int(np.argmin(obj))
    i, s = divmod(flat, K)
    if not np.isfinite(obj[i, s]):
        raise model.infeasible(list(m_arr))
    if idle:
        obj[i, s] = drift[s]
    S, m = int(S_idx[s]), int(m_arr[i])
    delta = partition_for(compute[i], d2d[i], cap[i], L, S, float(T[i, s]))
    return SegmentPlan(
        delta=delta, S=S, m=m, pipeline_s=float(model.steps * (S + m - 1) * T[i, s]), objective=float(obj[i, s])
    )


def uniform_delta(K: int, L: int) -> tuple[int, ...]:
    """Equal blocks over all K devices (the first L mod K get one more); devices beyond L get none."""
    base, extra = divmod(L, K)
    return tuple(base + (1 if k < extra else 0) for k in range(K))


def fixed_segments(model: ClusterModel, V: float, drift_by_S, delta, m: int) -> SegmentPlan:
    """A given partition and m (uniform / random policies), checked against C7 and C9'."""
    delta = np.asarray(delta, dtype=int)
    over_mem = np.nonzero(delta > model.memory_cap)[0]
    if over_mem.size:
        k = int(over_mem[0])
        raise InfeasiblePlanError(
            f"C7 (memory) violated in cluster {model.cluster}, device {k}: delta_k={int(delta[k])} blocks need more "
            "than "
            f"its memory allows ({int(model.memory_cap[k])} blocks); enable segment scheduling or raise "
            "network.device.memory_bytes"
        )
    bad = np.nonzero(~model.energy_ok(delta, m))[0]
    if bad.size:
        k = int(bad[0])
        raise InfeasiblePlanError(
            f"C9 (device energy) violated in cluster {model.cluster}, device {k}: "
            f"{model.device_energy(delta, m)[k]:.4g} J > "
            f"E_k^max={model.energy_max:g} J with delta_k={int(delta[k])}, m={m}; enable segment scheduling or raise "
            "network.device.energy_max_j"
        )
    ev = model.evaluate(delta, m)
    S = ev["S"]
    return SegmentPlan(
        delta=tuple(int(x) for x in delta),
        S=S,
        m=int(m),
        pipeline_s=ev["pipeline_s"],
        objective=float(V * ev["pipeline_s"] + np.asarray(drift_by_S, dtype=float)[S]),
    )
