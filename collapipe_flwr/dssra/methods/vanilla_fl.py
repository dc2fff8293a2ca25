"""VanillaFL (``vanilla_fl``), read the paper's way: "A standard FL approach that uses simple averaging for
model aggregation, without any model partitioning or parallel optimization" (Section VI.A), whose devices
each need the whole model's memory and are data users (Table III: "Memory usage of single devices ~5-6 G",
"Number of data users: Large"). Every device of a cluster that can hold the whole model is a data user and
trains it on its share ceil(b / D) of the cluster's batch, all in parallel; no pipeline, no D2D activations.

Modelled per round (``ClusterModel.evaluate_data_parallel``): delay ``steps * max over the D data users of
(L ceil(b/D) (o_l + o'_l) / (phi_k f_k) + c0)``, device energy eq. 16 with delta_k = L on each user's share.
The CU uploads one model (the average of its users' models, which reach it over D2D; the paper's FL has
"no additional D2D communication delay", so that hand-over is not counted).

What the CU executes: the plan names D (``ClusterPlan.data_users``); the CU trains D copies of the whole model,
each on its share of every batch from the round's global model, and averages them
(``collapipe_flwr/fl/cu/data_parallel.py``), on the device the plan's delta names (the fastest data user).
"""

from __future__ import annotations

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.method_registry import register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.segments import SegmentPlan
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
from collapipe_flwr.errors import InfeasiblePlanError
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload


def data_users_or_raise(model: ClusterModel) -> np.ndarray:
    """The cluster's data users (``ClusterModel.data_users``), or the error naming C7 or C9."""
    users = model.data_users()
    if users.any():
        return users
    L = model.num_blocks
    if (model.memory_cap < L).all():
        raise InfeasiblePlanError(
            f"C7 (memory) violated in cluster {model.cluster}: vanilla_fl trains all L={L} blocks on each device "
            f"but the largest device holds {int(model.memory_cap.max())}; raise network.device.memory_bytes"
        )
    raise InfeasiblePlanError(
        f"C9 (device energy) violated in cluster {model.cluster}: no device can train all L={L} blocks on its "
        f"share within E_k^max={model.energy_max:g} J (vanilla_fl); raise network.device.energy_max_j"
    )


def data_parallel_segments(model: ClusterModel, V: float, drift_by_S, idle: bool) -> SegmentPlan:
    """delta = L on the fastest data user (what the CU runs), with the data-parallel round delay; S = 1."""
    users = data_users_or_raise(model)
    ev = model.evaluate_data_parallel(users)
    k = int(np.argmax(np.where(users, model.flops_per_second, -np.inf)))
    delta = np.zeros(model.K, dtype=int)
    delta[k] = model.num_blocks
    return SegmentPlan(
        delta=tuple(int(x) for x in delta),
        S=1,
        m=1,
        pipeline_s=ev["pipeline_s"],
        objective=float(V * ev["pipeline_s"] + np.asarray(drift_by_S, dtype=float)[1]),
    )


def data_parallel_evaluate(model: ClusterModel, seg: SegmentPlan) -> dict:
    """The modelled figures of the round: every data user trains, not only the device the CU runs on."""
    return model.evaluate_data_parallel(data_users_or_raise(model))


@register_method("vanilla_fl")
def vanilla_fl_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """Data-parallel devices (module docstring), no D2D; power from the scheduling policy."""
    bits = method_uplink_bits(method, workload)
    shape = PlanShape(
        method=method.name,
        segments=data_parallel_segments,
        uplink_bits=bits,
        d2d=False,
        evaluate=data_parallel_evaluate,
    )
    return make_policy(scheduler, network, workload, seed, shape)
