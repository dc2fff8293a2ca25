"""The plan of every training method (paper Section VI): ``make_planner(method, scheduler, spec, workload, seed)``.

Every method gets a Policy (same ``plan(t, state) -> RoundPlan`` and ``observe(plan, losses)``): the CUs,
channels and (where the method optimises it) power come from the scheduling policy (``scheduler.name``),
and every ``plan.modelled`` figure comes from the same system-model functions, so methods are compared
like with like. What differs (docs/baselines.md):

* ``collapipe``: DSSRA's segments (Sub-1) or, with ``segment_scheduling: false`` (``collapipe_no_ss``),
  equal blocks over all K devices with m = ``fixed_m``.
* ``vanilla_fl``: each selected cluster trains the whole encoder on its single best device
  (delta = L on argmax_k f_k(t) phi_k among the devices that can hold it, S = 1, m = 1), no D2D, and the
  CU uploads the whole model (embedding + encoder + head, no activations).
* ``pipeline``: equal blocks over all K devices, m = ``fixed_m``; no aggregation, so the CU only sends the
  encoder output z_enc of every step to the server's head.
* ``titanic``: device selection by a small MILP per S, capability-proportional split (largest remainder),
  D2D activation passing, m = 1, and no power optimisation (the largest C6/C8'-feasible power).

Uplink bits follow the method's flags: z_enc of every local step when ``head_on_server``; the encoder and
embedding (plus the head when it is trained on the devices) when ``aggregate``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from collapipe_flwr.config import MethodSpec
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.segments import SegmentPlan, fixed_segments
from collapipe_flwr.errors import CollaPipeError, ConfigError, InfeasiblePlanError
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload

_METHOD_KEYS = ("name", "segment_scheduling", "fixed_m", "head_on_server", "aggregate")


def parse_method(method: Mapping[str, Any]) -> MethodSpec:
    """conf/method/*.yaml -> MethodSpec (one-line ConfigError on a bad key or value)."""
    if not isinstance(method, Mapping):
        raise ConfigError("method config must be a mapping; pick method=<name> (see conf/method/)")
    unknown = sorted(set(method) - set(_METHOD_KEYS))
    if unknown:
        raise ConfigError(f"unknown key method.{unknown[0]}; valid keys are {', '.join(_METHOD_KEYS)}")
    try:
        return MethodSpec(**dict(method))
    except CollaPipeError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"method config is not valid ({exc}); copy one from conf/method/") from None


def method_uplink_bits(method: MethodSpec, workload: Workload) -> float:
    """Bits a selected CU sends the BS per round (eq. 11) under this method's flags."""
    nbytes = 0.0
    if method.head_on_server:
        nbytes += workload.boundary_bytes[-1] * workload.batch_size * workload.steps_per_round  # z_enc per step
    if method.aggregate:
        nbytes += workload.encoder_bytes + workload.extra_upload_bytes
        if not method.head_on_server:
            nbytes += workload.head_bytes
    if nbytes <= 0:
        raise ConfigError(f"method {method.name} uploads nothing (head_on_server and aggregate both false); "
                          "set one of them to true")
    return 8.0 * nbytes


# ----------------------------------------------------------------------------- vanilla FL
def best_device_segments(model: ClusterModel, V: float, drift_by_S, idle: bool) -> SegmentPlan:
    """delta = L on the device with the largest f_k(t) phi_k that can hold all L blocks (C7, C9' at m = 1)."""
    L = model.num_blocks
    fits = model.block_cap(1) >= L
    if not fits.any():
        if (model.memory_cap < L).all():
            raise InfeasiblePlanError(
                f"C7 (memory) violated in cluster {model.cluster}: vanilla_fl trains all L={L} blocks on one device "
                f"but the largest device holds {int(model.memory_cap.max())}; raise network.device.memory_bytes"
            )
        raise InfeasiblePlanError(
            f"C9 (device energy) violated in cluster {model.cluster}: no device can train all L={L} blocks within "
            f"E_k^max={model.energy_max:g} J (vanilla_fl); raise network.device.energy_max_j"
        )
    k = int(np.argmax(np.where(fits, model.flops_per_second, -np.inf)))
    delta = np.zeros(model.K, dtype=int)
    delta[k] = L
    return fixed_segments(model, V, drift_by_S, delta, 1)


# ----------------------------------------------------------------------------- TITANIC
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


# ----------------------------------------------------------------------------- the factory
def make_planner(method: Mapping[str, Any], scheduler: Mapping[str, Any], spec: NetworkSpec, workload: Workload,
                 seed: int) -> Policy:
    """The planner of ``method`` (conf/method/*.yaml) under scheduling policy ``scheduler`` (conf/scheduler)."""
    m = parse_method(method)
    sched = dict(scheduler)
    bits = method_uplink_bits(m, workload)
    if m.name in ("collapipe", "collapipe_no_ss", "pipeline"):
        if not m.segment_scheduling or m.name == "pipeline":
            sched["segment_scheduling"] = False
            sched["fixed_m"] = m.fixed_m
        return make_policy(sched, spec, workload, seed, PlanShape(method=m.name, uplink_bits=bits))
    if m.name == "vanilla_fl":
        shape = PlanShape(method=m.name, segments=best_device_segments, uplink_bits=bits, d2d=False)
        return make_policy(sched, spec, workload, seed, shape)
    if m.name == "titanic":
        shape = PlanShape(method=m.name, segments=titanic_segments, uplink_bits=bits, optimise_power=False)
        return make_policy(sched, spec, workload, seed, shape)
    raise ConfigError(f"method.name={m.name!r} has no planner; pick one of collapipe, collapipe_no_ss, vanilla_fl, pipeline, titanic")
