"""Sub-1 (paper eq. 37, Algorithm 2), solved exactly: devices used, delta_k and m of one cluster.

    min over (S, m, delta)  V * tau_n^pipe(S, m, delta) + drift(S)
    s.t. C1 (sum delta_k = L, delta_k, m integers), C2 (S = #{delta_k > 0}), C7 (memory), C9' (energy)

with tau^pipe = steps (S + m - 1) max_{k: delta_k > 0} (delta_k c_k(m) + d_k(m)) (eq. 15 as read in
system/pipeline_model.py; d_k(m) = c0 + tau_k^dd(m), ClusterModel.chunk_fixed) and drift(S) the queue
term (Y_n S in the paper's P2, Y_n Gamma_n(S) here). Under ``pipeline.checkpoint`` c_k(m) is a recomputed
micro-batch's (ClusterModel.planned_compute_per_block: one more forward o_l): exact under ``always``; under
``except_last`` (its last micro-batch not recomputed) a bound on the critical path by at most one recompute,
which ClusterModel.evaluate (the modelled round) counts exactly.

Exactness without a MILP: for fixed m, a stage-time bound T admits a partition on S devices iff the S
devices with the most room u_k(T) = #{delta in 1..cap_k(m): delta c_k + d_k <= T} all have u_k >= 1 and
sum_k u_k >= L (then shrink delta_k from u_k, never below 1, until the sum is L). The optimal T is one
of the K*L chunk times delta c_k + d_k, so sweeping those candidates for every m in 1..m_max gives the
true optimum over all device subsets, all delta and all m (stage_times.py computes it for every S at once,
and the m values that share a micro-batch size with a smaller m are skipped: ``distinct_b_hat``). Device
order does not matter (footnote 1). ``StageTables`` / ``solve_tables`` do this for all clusters of a round at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collapipe_flwr.dssra.cluster_model import PER_DEVICE_FIELDS, ClusterModel
from collapipe_flwr.dssra.stage_times import min_stage_times, partitions
from collapipe_flwr.errors import InfeasiblePlanError


@dataclass(frozen=True)
class SegmentPlan:
    """Sub-1's answer for one cluster: delta (per device), S, m, the modelled pipeline delay and objective."""

    delta: tuple[int, ...]
    S: int
    m: int
    pipeline_s: float
    objective: float


# The scalars of the cost model that stack_models needs to be the same in every cluster.
SHARED_FIELDS = (
    "num_blocks",
    "batch_size",
    "steps",
    "flops_per_sample_block",
    "forward_flops_per_sample_block",
    "activation_bits",
    "energy_max",
    "kappa",
    "checkpoint",
)


def stack_models(models: Sequence[ClusterModel]) -> ClusterModel:
    """N clusters of K devices each as one ClusterModel whose per-device arrays are [N, 1, K], so that
    ``compute_per_block``, ``chunk_fixed`` and ``block_cap`` of an array of M values of m give [N, M, K]
    (the same elementwise formulas, eqs. 13-16, as for one cluster). The scalars (L, b, steps, o_l + o'_l, o_l,
    activation bits, E_k^max, kappa, pipeline.checkpoint) must agree; ``cluster`` is the first one's, cu_step_s is
    dropped."""
    first = models[0]
    for model in models[1:]:
        if model.K != first.K or any(getattr(model, f) != getattr(first, f) for f in SHARED_FIELDS):
            raise ValueError(f"cluster {model.cluster}'s cost model does not stack with cluster {first.cluster}'s")
    arrays: dict[str, Any] = {
        f: np.stack([np.asarray(getattr(m, f)) for m in models])[:, None, :] for f in PER_DEVICE_FIELDS
    }
    return replace(first, cu_step_s=0.0, **arrays)


def distinct_b_hat(batch_size: int, m_values: np.ndarray) -> np.ndarray:
    """Mask of the m values Sub-1 needs to try: the smallest m of each micro-batch size b_hat = ceil(b / m).
    A larger m with the same b_hat has the same chunk times c_k, d_k (re-materializing, no smaller), a cap no larger
    (E_k^pipe grows with m,
    eq. 16) and a longer pipeline (S + m - 1), so its objective (V >= 0) is never smaller, and argmin's ties
    go to the earlier m. Only for increasing m values (otherwise every m is kept)."""
    m_values = np.asarray(m_values, dtype=int)
    if m_values.size < 2 or np.any(np.diff(m_values) <= 0):
        return np.ones(m_values.shape, dtype=bool)
    b_hat = -(-batch_size // m_values)
    return np.concatenate([[True], b_hat[1:] != b_hat[:-1]])


TABLE_ELEMENTS = 1 << 18  # chunk times (N M K L) per min_stage_times call: bounded memory, cache-sized


@dataclass(frozen=True)
class StageTables:
    """Sub-1's data for N clusters (stacked with stack_models) over the m values it tries: per block compute
    time c_k(m), fixed part d_k(m) = c0 + tau_k^dd(m), block cap (C7, C9') and T*(m, S), each [N, M, K]."""

    m: np.ndarray
    compute: np.ndarray
    d2d: np.ndarray
    cap: np.ndarray
    T: np.ndarray
    steps: int
    L: int

    @classmethod
    def build(cls, models: Sequence[ClusterModel], m_values, V: float) -> StageTables:
        stacked = stack_models(models)
        m_arr = np.asarray(list(m_values), dtype=int)
        if V >= 0:
            m_arr = m_arr[distinct_b_hat(stacked.batch_size, m_arr)]
        compute, d2d = stacked.planned_compute_per_block(m_arr), stacked.chunk_fixed(m_arr)
        cap = stacked.block_cap(m_arr)
        L = stacked.num_blocks
        step = max(1, TABLE_ELEMENTS // max(1, compute[0].size * L))  # clusters per block
        T = np.concatenate(
            [
                min_stage_times(compute[i : i + step], d2d[i : i + step], cap[i : i + step], L)
                for i in range(0, len(models), step)
            ]
        )
        return cls(m_arr, compute, d2d, cap, T, stacked.steps, L)


def solve_tables(tables: StageTables, rows, V: float, drift: np.ndarray, idle: np.ndarray) -> list[SegmentPlan | None]:
    """Exact Sub-1 (eq. 37) for the clusters ``rows`` of ``tables``: argmin over (m, S) of V tau^pipe + drift(S)
    (``drift`` [R, K+1], S = 0..K), or for an idle cluster (``idle`` [R]) the least drift(S), ties broken by the
    smallest pipeline delay. None where no partition meets C7 and C9'."""
    rows = np.asarray(rows, dtype=int)
    T = tables.T[rows]  # [R, M, K]
    R, _, K = T.shape
    finite = np.isfinite(T)
    drift = np.asarray(drift, dtype=float)[:, None, 1 : K + 1]
    pipe = tables.steps * (np.arange(1, K + 1)[None, None, :] + tables.m[None, :, None] - 1) * T
    obj = np.where(finite, V * pipe + drift, np.inf)
    best_drift = np.where(finite, drift, np.inf).min(axis=(1, 2), keepdims=True)
    idle_obj = np.where(finite & (drift <= best_drift), pipe, np.inf)
    use_idle = np.asarray(idle, dtype=bool)[:, None, None] & np.isfinite(obj).any(axis=(1, 2), keepdims=True)
    obj = np.where(use_idle, idle_obj, obj)
    flat = np.argmin(obj.reshape(R, -1), axis=1)
    i, s = np.divmod(flat, K)
    ok = np.isfinite(obj[np.arange(R), i, s])
    at = (rows[ok], i[ok])
    delta = partitions(tables.compute[at], tables.d2d[at], tables.cap[at], tables.L, s[ok] + 1, T[ok, i[ok], s[ok]])
    value = np.where(np.asarray(idle, dtype=bool), drift[np.arange(R), 0, s], obj[np.arange(R), i, s])
    plans: list[SegmentPlan | None] = [None] * R
    for r, d in zip(np.nonzero(ok)[0], delta):
        plans[r] = SegmentPlan(
            delta=tuple(int(x) for x in d),
            S=int(s[r]) + 1,
            m=int(tables.m[i[r]]),
            pipeline_s=float(pipe[r, i[r], s[r]]),
            objective=float(value[r]),
        )
    return plans


def solve_segments(model: ClusterModel, V: float, drift_by_S, m_values, idle: bool = False) -> SegmentPlan:
    """Exact Sub-1 for one cluster. ``drift_by_S[S]`` (S = 0..K) is the queue term; raises
    InfeasiblePlanError (C7 or C9) when no partition fits.

    idle=True: the cluster has no channel this round (BCD, Sub-1 given Sub-2's matching), so its delay does not
    enter the objective: minimise drift(S) alone, ties (the same S) broken by the smallest pipeline delay."""
    m_values = list(m_values)
    tables = StageTables.build([model], m_values, V)
    plan = solve_tables(tables, [0], V, np.asarray(drift_by_S, dtype=float)[None, :], np.array([idle]))[0]
    if plan is None:
        raise model.infeasible(m_values)
    return plan


def uniform_delta(K: int, L: int) -> tuple[int, ...]:
    """Equal blocks over all K devices (the first L mod K get one more); devices beyond L get none."""
    base, extra = divmod(L, K)
    return tuple(base + (1 if k < extra else 0) for k in range(K))


def best_m_segments(model: ClusterModel, V: float, drift_by_S, delta, m_values) -> SegmentPlan:
    """A given partition (CollaPipe without segment scheduling: equal blocks) with the m in ``m_values`` that
    minimises Sub-1's objective V tau^pipe + drift among the m that meet C7 and C9'."""
    best: SegmentPlan | None = None
    error: InfeasiblePlanError | None = None
    for m in m_values:
        try:
            plan = fixed_segments(model, V, drift_by_S, delta, m)
        except InfeasiblePlanError as err:
            error = err
            continue
        if best is None or plan.objective < best.objective:
            best = plan
    if best is None:
        assert error is not None, "m_values is empty"
        raise error
    return best


def fixed_segments(model: ClusterModel, V: float, drift_by_S, delta, m: int) -> SegmentPlan:
    """A given partition and m (uniform / random policies), checked against C7 and C9'."""
    delta = np.asarray(delta, dtype=int)
    cap = model.stage_memory_cap(delta, m)
    over_mem = np.nonzero(delta > cap)[0]
    if over_mem.size:
        k = int(over_mem[0])
        raise InfeasiblePlanError(
            f"C7 (memory) violated in cluster {model.cluster}, device {k}: delta_k={int(delta[k])} blocks need more "
            "than "
            f"its memory allows ({int(cap[k])} blocks); enable segment scheduling or raise "
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
