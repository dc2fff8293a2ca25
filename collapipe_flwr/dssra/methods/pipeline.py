"""PipeLine (``pipeline``): batch-based pipeline parallelism without segment optimisation or aggregation."""

from __future__ import annotations

from dataclasses import replace

from collapipe_flwr.dssra.method_registry import register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits
from collapipe_flwr.dssra.policies import PlanShape, Policy, make_policy
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.workload import Workload


@register_method("pipeline")
def pipeline_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """Equal blocks over all K devices, m = ``method.fixed_m`` (never Sub-1); the CU sends only z_enc of
    every step (``aggregate: false``)."""
    bits = method_uplink_bits(method, workload)
    scheduler = replace(scheduler, segment_scheduling=False, fixed_m=method.fixed_m)
    return make_policy(scheduler, network, workload, seed, PlanShape(method=method.name, uplink_bits=bits))
