"""VanillaFL (``vanilla_fl``): FedAvg of the whole model, each selected CU training it on its single best
device (no partition, no pipeline, no D2D)."""

from __future__ import annotations

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.method_registry import register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.segments import SegmentPlan, fixed_segments
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
from collapipe_flwr.errors import InfeasiblePlanError
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload


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


@register_method("vanilla_fl")
def vanilla_fl_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """delta = L on the best device (best_device_segments), no D2D; power from the scheduling policy."""
    bits = method_uplink_bits(method, workload)
    shape = PlanShape(method=method.name, segments=best_device_segments, uplink_bits=bits, d2d=False)
    return make_policy(scheduler, network, workload, seed, shape)
