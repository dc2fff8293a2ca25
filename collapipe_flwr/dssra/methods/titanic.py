"""TITANIC (``titanic``, Su et al., INFOCOM 2024), re-implemented from its description: device selection by
integer optimisation, capability-proportional model split, D2D activation passing, m = 1, no power
optimisation."""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.method_registry import register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.segments import SegmentPlan, fixed_segments
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload


def proportional_split(weights, caps, L: int) -> tuple[int, ...]:
    """delta proportional to ``weights`` (sum L), at most ``caps`` each, rounded by largest remainder.

    Quotas q_k = L' w_k / sum w over the devices not yet at their cap; a device whose quota exceeds its cap
    is fixed at the cap and the rest re-shared. Floors first; the L - sum floor leftover blocks go one each
    to the largest fractional parts (ties: lower index). Devices with weight 0 get nothing.
    """
    w = np.asarray(weights, dtype=float)
    caps = np.asarray(caps, dtype=int)
    if int(np.where(w > 0, caps, 0).sum()) < L:
        raise ValueError("the devices with weight > 0 hold fewer than L blocks")
    delta = np.zeros(len(w), dtype=int)
    free = w > 0
    remaining = L
    while True:
        if not free.any():
            quota = np.zeros(len(w))
            break
        quota = np.where(free, remaining * w / w[free].sum(), 0.0)
        over = free & (quota > caps)
        if not over.any():
            break
        delta[over] = caps[over]
        remaining -= int(caps[over].sum())
        free &= ~over
    floor = np.floor(quota + 1e-12).astype(int)
    delta[free] = floor[free]
    left = remaining - int(floor[free].sum())
    frac = np.where(free & (floor < caps), quota - floor, -np.inf)
    for k in sorted(range(len(w)), key=lambda k: (-frac[k], k))[:left]:
        delta[k] += 1
    return tuple(int(x) for x in delta)


def select_devices(capability, caps, L: int, S: int) -> np.ndarray | None:
    """MILP: choose exactly S devices maximising total capability sum z_k f_k phi_k with room for the model,
    sum z_k cap_k >= L (C7/C9'), z_k = 0 where cap_k = 0. None if infeasible."""
    c = np.asarray(capability, dtype=float)
    caps = np.asarray(caps, dtype=float)
    K = len(c)
    scale = c.max() if c.max() > 0 else 1.0
    res = milp(
        c=-c / scale,
        integrality=np.ones(K),
        bounds=Bounds(np.zeros(K), (caps >= 1).astype(float)),
        constraints=[LinearConstraint(np.ones((1, K)), S, S), LinearConstraint(caps[None, :], L, np.inf)],
    )
    if not res.success or res.x is None:
        return None
    return np.round(res.x).astype(bool)


def titanic_segments(model: ClusterModel, V: float, drift_by_S, idle: bool) -> SegmentPlan:
    """TITANIC's plan for one cluster at m = 1: for every S a MILP picks the devices (select_devices), the
    model is split in proportion to f_k(t) phi_k (proportional_split), and the S with the smallest modelled
    pipeline delay wins (ties: fewer devices)."""
    L = model.num_blocks
    caps = model.block_cap(1)
    best: SegmentPlan | None = None
    for S in range(1, min(model.K, L) + 1):
        chosen = select_devices(model.flops_per_second, caps, L, S)
        if chosen is None:
            continue
        delta = proportional_split(np.where(chosen, model.flops_per_second, 0.0), caps, L)
        plan = fixed_segments(model, V, drift_by_S, delta, 1)
        if best is None or plan.pipeline_s < best.pipeline_s * (1 - 1e-12):
            best = plan
    if best is None:
        raise model.infeasible([1])
    return best


@register_method("titanic")
def titanic_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """TITANIC's segments (titanic_segments) at m = 1; channels from the scheduling policy, each CU at the
    largest C6/C8'-feasible power (no power optimisation)."""
    bits = method_uplink_bits(method, workload)
    shape = PlanShape(method=method.name, segments=titanic_segments, uplink_bits=bits, optimise_power=False)
    return make_policy(scheduler, network, workload, seed, shape)
