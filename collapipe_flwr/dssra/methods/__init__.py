"""The plan of every training method (paper Section VI), one module each, found by name.

Every method gets a Policy (``plan(t, state) -> RoundPlan`` and ``observe(plan, losses)``) from
``make_planner(method, scheduler, network, workload, seed)``: the CUs, channels and (where the method
optimises it) power come from the scheduling policy (``scheduler.name``), and every ``plan.modelled``
figure comes from the same system-model functions, so methods are compared like with like. What differs
(docs/baselines.md) is the :class:`~collapipe_flwr.dssra.policies.PlanShape` each module builds:

* ``collapipe.py`` - ``collapipe``: DSSRA's segments (Sub-1) or, with ``segment_scheduling: false``
  (``collapipe_no_ss``), equal blocks over all K devices with m = ``fixed_m``.
* ``vanilla_fl.py`` - each selected cluster trains the whole encoder on its single best device (delta = L on
  argmax_k f_k(t) phi_k among the devices that can hold it, S = 1, m = 1), no D2D, and the CU uploads the
  whole model (embedding + encoder + head, no activations).
* ``pipeline.py`` - equal blocks over all K devices, m = ``fixed_m``; no aggregation, so the CU only sends
  the encoder output z_enc of every step to the server's head.
* ``titanic.py`` - device selection by a small MILP per S, capability-proportional split (largest
  remainder), D2D activation passing, m = 1, and no power optimisation (the largest C6/C8'-feasible power).

Uplink bits follow the method's flags (``uplink.py``, eq. 11).

Adding a method: one module here with a factory ``(MethodSpec, SchedulerSpec, NetworkSpec, Workload, seed)
-> Policy`` decorated with ``@register_method("<name>")`` (collapipe_flwr/dssra/method_registry.py), plus
``conf/method/<name>.yaml``. Every module of this package is imported when the registry is first read.
"""

from collapipe_flwr.dssra.method_registry import METHODS, make_planner, register_method
from collapipe_flwr.dssra.methods.uplink import method_uplink_bits

__all__ = ["METHODS", "make_planner", "method_uplink_bits", "register_method"]
