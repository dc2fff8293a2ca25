"""Channel selection rules of the scheduling policies (``scheduler.name``), one small class each.

Every rule gets Sub-2's (CU, channel) cost matrix for the round (:class:`ChannelProblem`) and returns, per
CU n, the channel j it uploads on (a_{n,j} = 1) or None (CU n sits out this round):

* ``dssra`` (Algorithm 4): Hungarian matching with virtual channels (``match_channels``), Lyapunov queues Y_n
  in the cost; block coordinate descent with Sub-1.
* ``uniform``: the same matching, but without segment scheduling (equal blocks on all K, m = fixed_m).
* ``random``: min(N, J) CUs at random on random free channels.
* ``loss_only``: the CUs with the highest last reported loss first (never-seen CUs first).
* ``delay_only``: the CUs with the smallest modelled pipeline delay tau_n^pipe first.

The three baselines ignore the queues (one Sub-1/Sub-2 pass, no drift terms) and hand each chosen CU, in
rank order, its best free channel (the largest h / (I + B N0)); ``random`` picks a random free channel.

Adding a policy is one :class:`ChannelSelector` subclass registered with :func:`register_selector` plus one
``conf/scheduler/<name>.yaml``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, TypeVar

import numpy as np

from collapipe_flwr.dssra.channels import match_channels

__all__ = ["SELECTORS", "ChannelProblem", "ChannelSelector", "register_selector", "sit_out_reason", "taken_channels"]


@dataclass(frozen=True)
class ChannelProblem:
    """Sub-2's view of one round after power control.

    cost [N, J]: V (tau_n^pipe + tau_{n,j}^Up) + power drift of CU n on channel j (inf where infeasible).
    virtual [N]: the sit-out drift of CU n (cost of its virtual channel).  pipeline_s [N]: tau_n^pipe.
    slope [N, J]: h_{n,j} / (I_j + B_j N0).  feasible [N, J]: a power within C6/C8' exists.
    last_loss: the last loss each CU reported (``Policy.observe``).
    """

    cost: np.ndarray
    virtual: np.ndarray
    pipeline_s: np.ndarray
    slope: np.ndarray
    feasible: np.ndarray
    last_loss: Mapping[int, float]


class ChannelSelector(ABC):
    """One policy's rule for a_{n,j}.

    uses_queues: the policy minimises the drift-plus-penalty (Y_n in Sub-1 and Sub-2, BCD passes);
    False = a baseline that only looks at delay (one pass, no drift terms, largest feasible power).
    segment_scheduling: None = ``scheduler.segment_scheduling`` decides (default true); True/False = the
    policy forces it.
    """

    name: ClassVar[str]
    uses_queues: ClassVar[bool] = False
    segment_scheduling: ClassVar[bool | None] = None

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    @abstractmethod
    def select(self, problem: ChannelProblem) -> list[int | None]:
        """The channel of every CU (None: not selected); no channel is used twice."""


_SELECTORS: dict[str, type[ChannelSelector]] = {}
SELECTORS: Mapping[str, type[ChannelSelector]] = MappingProxyType(_SELECTORS)

_Rule = TypeVar("_Rule", bound=type[ChannelSelector])


def register_selector(name: str) -> Callable[[_Rule], _Rule]:
    """Class decorator: make ``cls`` the rule of ``scheduler.name = name``."""

    def register(cls: _Rule) -> _Rule:
        if name in _SELECTORS and _SELECTORS[name].__qualname__ != cls.__qualname__:
            raise ValueError(f"scheduling policy {name!r} is registered twice")
        cls.name = name
        _SELECTORS[name] = cls
        return cls

    return register


@register_selector("dssra")
class MatchingSelector(ChannelSelector):
    """Hungarian matching of CUs to channels plus one virtual (sit-out) channel per CU (Algorithm 4)."""

    uses_queues = True

    def select(self, problem: ChannelProblem) -> list[int | None]:
        return match_channels(problem.cost, problem.virtual)


@register_selector("uniform")
class UniformSelector(MatchingSelector):
    """DSSRA's matching with equal blocks on all K devices and m = fixed_m (no Sub-1)."""

    segment_scheduling = False


class GreedySelector(ChannelSelector):
    """A baseline: rank the CUs that have a feasible channel, then each in turn takes a free channel."""

    @abstractmethod
    def order(self, problem: ChannelProblem, candidates: list[int]) -> list[int]:
        """The candidate CUs, first served first."""

    def pick(self, problem: ChannelProblem, n: int, free: list[int]) -> int:
        """CU n's channel among the free feasible ones: the best h / (I + B N0) (ties: lower j)."""
        return max(free, key=lambda j: (problem.slope[n, j], -j))

    def select(self, problem: ChannelProblem) -> list[int | None]:
        N, J = problem.cost.shape
        candidates = [n for n in range(N) if problem.feasible[n].any()]
        channel: list[int | None] = [None] * N
        used: set[int] = set()
        for n in self.order(problem, candidates):
            if len(used) == J:
                break
            free = [j for j in range(J) if j not in used and problem.feasible[n, j]]
            if free:
                j = self.pick(problem, n, free)
                channel[n] = j
                used.add(j)
        return channel


@register_selector("random")
class RandomSelector(GreedySelector):
    """CUs in random order, each on a random free channel."""

    def order(self, problem: ChannelProblem, candidates: list[int]) -> list[int]:
        return [int(x) for x in self.rng.permutation(candidates)]

    def pick(self, problem: ChannelProblem, n: int, free: list[int]) -> int:
        return int(self.rng.choice(free))


@register_selector("loss_only")
class LossOnlySelector(GreedySelector):
    """Highest last reported loss first; CUs that never reported come before all others (ties: lower n)."""

    def order(self, problem: ChannelProblem, candidates: list[int]) -> list[int]:
        return sorted(candidates, key=lambda n: (-problem.last_loss.get(n, np.inf), n))


@register_selector("delay_only")
class DelayOnlySelector(GreedySelector):
    """Smallest modelled pipeline delay tau_n^pipe first (ties: lower n)."""

    def order(self, problem: ChannelProblem, candidates: list[int]) -> list[int]:
        return sorted(candidates, key=lambda n: (problem.pipeline_s[n], n))


def sit_out_reason(
    problem: ChannelProblem, channel: list[int | None], n: int, uses_queues: bool, taken: np.ndarray | None = None
) -> str:
    """Why CU n got no channel this round (``channel[n] is None``), in one line for the run's output.

    In the order they can apply: no feasible channel (C8, the CU's upload energy E_n^max, cannot be met at
    any power); every channel went to another CU (J channels, more CUs than that wanting one); for the
    drift-plus-penalty matching, the sit-out (virtual channel) cost beat every free channel's cost
    V (tau_n^pipe + tau_{n,j}^Up) + power drift; else the baseline's ranking left it out. ``taken``: the mask of
    the channels in ``channel`` (``taken_channels``), when the caller asks for many CUs.
    """
    if channel[n] is not None:
        return ""
    feasible = np.asarray(problem.feasible[n], dtype=bool)
    if not feasible.any():
        return "no channel meets its upload energy limit E_n^max (C8) at any power"
    taken = taken_channels(channel, len(feasible)) if taken is None else taken
    free = np.nonzero(feasible & ~taken)[0]
    if not free.size:
        return f"all {int(taken.sum())} usable channels went to other CUs"
    if uses_queues:
        best = float(np.min(problem.cost[n, free]))
        return (
            f"sitting out costs less in the drift-plus-penalty objective ({float(problem.virtual[n]):.4g} < "
            f"{best:.4g} on its best free channel)"
        )
    return "ranked below the CUs the policy served first"


def taken_channels(channel: list[int | None], J: int) -> np.ndarray:
    """[J] mask of the channels some CU got."""
    taken = np.zeros(J, dtype=bool)
    taken[[j for j in channel if j is not None]] = True
    return taken
