"""The round's plan X(t) (eq. 27): the channel/device state of round t and the scheduling policy that plans it.

``RoundPlanner.plan(t)`` samples the round's state (fading, interference, availability: seeded, so every
run with the same seed sees the same network) and asks the method's policy (DSSRA or a baseline) for
X(t) = [m, S, delta_k, I_{n,j}, p_n]; ``observe`` hands the round's losses back so the policy can update
its queues Y_n (eq. 29).

With ``system.profile: measured`` the policy plans from the CUs' measured profiles (kept and smoothed in a
:class:`~collapipe_flwr.system.profile.ProfileStore`) instead of the preset's device numbers; with the
testbed on (``testbed=emulated``) ``emulation_for`` says what each selected cluster's devices and uplink are
throttled to this round: the configured network, made real (docs/testbed.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.plan import ClusterPlan, RoundPlan
from collapipe_flwr.dssra.policies import Policy
from collapipe_flwr.dssra.replan import Sub1Inputs
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.fl.server.memory_model import MemoryCorrection, memory_rows
from collapipe_flwr.pipeline.virtual_clock import ClusterClock
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.measurement_spec import SystemSpec, TestbedSpec
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.profile import ClusterProfile, DeviceEmulation, ProfileStore
from collapipe_flwr.system.state import StateSampler
from collapipe_flwr.system.workload import Workload


class RoundPlanner:
    """The network, its per-round state sampler and the policy; remembers the last plan and the measured
    profiles."""

    def __init__(
        self,
        network: NetworkSpec,
        sampler: StateSampler,
        policy: Policy,
        policy_name: str,
        system: SystemSpec | None = None,
        testbed: TestbedSpec | None = None,
    ) -> None:
        self.network = network
        self.sampler = sampler
        self.policy = policy
        self.policy_name = policy_name
        self.system = system or SystemSpec()
        self.testbed = testbed or TestbedSpec()
        self.profiles = ProfileStore(self.system.refresh_every, self.system.smoothing)
        self.memory = MemoryCorrection(network.device_runtime_bytes)  # C7's terms fitted on the measured peaks
        self.last_plan: RoundPlan | None = None

    def plan(self, t: int) -> RoundPlan:
        profiles = self.profiles.profiles if self.system.measured else None
        self.last_plan = self.policy.plan(t, self.sampler.sample(t), profiles)
        return self.last_plan

    def observe(self, losses: dict[int, float]) -> None:
        """The selected CUs' training losses of the last planned round (the queues' input, eq. 29)."""
        if self.last_plan is not None:
            self.policy.observe(self.last_plan, losses)

    def devices_of(self, cluster: int) -> list[DeviceProfile]:
        return self.network.devices_of(cluster)

    def absorb_memory(self, plan: RoundPlan, workload: Workload, clients: Mapping[int, RoundReport]) -> dict:
        """C7 beside the devices' measured peaks for round t (the record's ``memory`` section) and C7's terms fitted
        on them (gamma_rt, the slope on gamma_0); the policy plans with the fit under ``system.profile: measured`` and
        on a testbed that enforces gamma_k^max (``testbed.memory_limit``: a plan over a limit kills a device), else
        from the model as configured."""
        rows = memory_rows(plan, workload, clients, self.network.device_runtime_bytes)
        runtime_bytes, scale = self.memory.update(rows.pop("pairs"))
        enforced = self.testbed.enabled and self.testbed.memory_limit
        applied = (self.system.measured or enforced) and self.memory.measured
        if applied:
            self.policy.workload = workload.with_memory_scale(scale)
            self.policy.spec = dataclasses.replace(self.network, device_runtime_bytes=runtime_bytes)
        fit = {"runtime_bytes": runtime_bytes, "gamma0_scale": scale, "applied": applied}
        return {**rows, "model": {"runtime_bytes": self.network.device_runtime_bytes}, "fit": fit}

    # ------------------------------------------------------------------ measured profiles
    @property
    def uses_profiles(self) -> bool:
        """Whether CUs report profiles: measured plans need them, and on the testbed the configured run
        reports them too, so both runs record what the devices did."""
        return self.system.measured or self.testbed.enabled

    def measure_repeats(self, cluster: int, t: int) -> int:
        """Timed calls per size if cluster n should measure its devices in round t, else 0 (measured profiles
        only; on the testbed the configured run measures too, so both runs report what the devices did)."""
        if not self.uses_profiles:
            return 0
        return self.system.repeats if self.profiles.due(cluster, t) else 0

    def absorb_profile(self, cluster: int, report: ClusterProfile) -> ClusterProfile:
        return self.profiles.update(cluster, report)

    # ------------------------------------------------------------------ the testbed
    def emulation_for(self, t: int, plan: ClusterPlan, workload: Workload) -> DeviceEmulation | None:
        """What the testbed imposes on cluster n in round t (None when it is off): a CPU quota per device from
        its configured phi_k f_k(t) (``fastest_cores`` for the network's fastest device at full availability),
        each link at the round's r_k^dd (eq. 13) with tau_0 split over the two hand-overs of a micro-batch
        (z^s forward, g^s back), and the uplink at the Shannon rate of the channel and power of the plan."""
        tb = self.testbed
        if not tb.enabled:
            return None
        n = plan.cluster
        model = ClusterModel.build(self.network, self.sampler.sample(t), workload, n)
        fastest = max(d.flops_per_second for ds in self.network.devices for d in ds)
        cores = tb.fastest_cores * model.flops_per_second / fastest if tb.cpu_quota else np.zeros(model.K)
        if tb.cpu_quota and tb.cpu_cores:  # one per device: config._check_testbed refused any other length
            cores = np.asarray(tb.cpu_cores)
        rate = model.d2d_rate * tb.d2d_rate_scale / 8.0 if tb.d2d else np.zeros(model.K)
        latency = np.asarray(model.d2d_latency_s) / 2.0 if tb.d2d else np.zeros(model.K)
        last = self.last_plan
        modelled = last.modelled if last is not None else None
        uplink = modelled.uplink_bytes_per_s(n) if tb.uplink and modelled is not None else 0.0
        memory = tuple(d.memory_bytes for d in self.network.devices_of(n)) if tb.memory_limit else ()
        return DeviceEmulation(
            tuple(float(x) for x in cores),
            tuple(float(x) for x in rate),
            tuple(float(x) for x in latency),
            uplink,
            memory,
        )

    # ------------------------------------------------------------------ the virtual clock
    def clock_for(
        self,
        t: int,
        plan: ClusterPlan,
        workload: Workload,
        host_flops: float,
        replan: Sub1Inputs | None = None,
        emulation: DeviceEmulation | None = None,
    ) -> ClusterClock | None:
        """Cluster n's virtual clock rates in round t (``pipeline/virtual_clock.py``), from the model the plan was
        made with (``replan``'s: configured or measured phi_k f_k(t), r_k^dd, tau_0) and the plan's uplink: device
        k's scale is host_flops / phi_k f_k(t), R_n = eq. (11)'s bits / the plan's tau_n^Up. On the testbed
        (``emulation``) the clock keeps what the testbed imposes instead, so that it can be checked against it:
        1 / the cores of a device's CPU quota, its link's throttled rate and latency, the uplink's bucket. None
        without a host speed."""
        if not host_flops > 0:
            return None
        n = plan.cluster
        if replan is not None:
            model = replan.model
        else:
            model = ClusterModel.build(self.network, self.sampler.sample(t), workload, n)
        scale = host_flops / np.asarray(model.flops_per_second, dtype=float)
        rate = np.asarray(model.d2d_rate, dtype=float) / 8.0
        rate = np.where(np.isfinite(rate), rate, 0.0)  # an infinite r_k^dd (no D2D link in the model): no D2D time
        latency = np.broadcast_to(np.asarray(model.d2d_latency_s, dtype=float), (model.K,)).copy()
        last = self.last_plan
        modelled = last.modelled if last is not None and last.round == t else None
        uplink = modelled.uplink_bytes_per_s(n) if modelled is not None else 0.0
        if emulation is not None:
            scale = np.asarray([1.0 / c if c > 0 else s for c, s in zip(emulation.cpu_cores, scale)])
            throttled = np.asarray(emulation.d2d_bytes_per_s, dtype=float) > 0
            rate = np.where(throttled, emulation.d2d_bytes_per_s, rate)
            latency = np.where(throttled, 2.0 * np.asarray(emulation.d2d_latency_s, dtype=float), latency)
            uplink = emulation.uplink_bytes_per_s or uplink
        return ClusterClock(
            scale=tuple(float(x) for x in scale),
            d2d_bytes_per_s=tuple(float(x) for x in rate),
            d2d_latency_s=tuple(float(x) for x in latency),
            uplink_bytes_per_s=float(uplink),
            host_flops=float(host_flops),
        )
