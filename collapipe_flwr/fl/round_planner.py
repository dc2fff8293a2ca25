"""The round's plan X(t) (eq. 27): the channel/device state of round t and the scheduling policy that plans it.

``RoundPlanner.plan(t)`` samples the round's state (fading, interference, availability: seeded, so every
run with the same seed sees the same network) and asks the method's policy (DSSRA or a baseline) for
X(t) = [m, S, delta_k, I_{n,j}, p_n]; ``observe`` hands the round's losses back so the policy can update
its queues Y_n (eq. 29).
"""

from __future__ import annotations

from collapipe_flwr.dssra.plan import RoundPlan
from collapipe_flwr.dssra.policies import Policy
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import StateSampler


class RoundPlanner:
    """The network, its per-round state sampler and the policy; remembers the last plan."""

    def __init__(self, network: NetworkSpec, sampler: StateSampler, policy: Policy, policy_name: str) -> None:
        self.network = network
        self.sampler = sampler
        self.policy = policy
        self.policy_name = policy_name
        self.last_plan: RoundPlan | None = None

    def plan(self, t: int) -> RoundPlan:
        self.last_plan = self.policy.plan(t, self.sampler.sample(t))
        return self.last_plan

    def observe(self, losses: dict[int, float]) -> None:
        """The selected CUs' training losses of the last planned round (the queues' input, eq. 29)."""
        if self.last_plan is not None:
            self.policy.observe(self.last_plan, losses)

    def devices_of(self, cluster: int) -> list[DeviceProfile]:
        return self.network.devices_of(cluster)
