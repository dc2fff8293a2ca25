"""CollaPipe (``collapipe``) and its ablation without segment scheduling (``collapipe_no_ss``)."""

from __future__ import annotations

from dataclasses import replace

from collapipe_flwr.dssra.method_registry import register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload


@register_method("collapipe", "collapipe_no_ss")
def collapipe_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """DSSRA's plan: S, m, delta by Sub-1, or, with ``method.segment_scheduling: false``, equal blocks over
    all K devices with m = ``method.fixed_m``; channels and power from the scheduling policy."""
    bits = method_uplink_bits(method, workload)
    if not method.segment_scheduling:
        scheduler = replace(scheduler, segment_scheduling=False, fixed_m=method.fixed_m)
    return make_policy(scheduler, network, workload, seed, PlanShape(method=method.name, uplink_bits=bits))
