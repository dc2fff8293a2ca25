"""The server optimizer's choices and hyper-parameter ranges, defined once.

Two callers apply these rules: :class:`~collapipe_flwr.config.sections.FederationSpec` when the config is
built (``federation.server_optimizer``, ``federation.server_lr`` ...: every value in the config must be valid,
used or not, so an override that switches the optimizer cannot wake a bad value) and
``fl/server/server_optimizer.ServerOptimizer`` for a direct caller (only the values the chosen optimizer uses;
FedAvg uses none). Both raise the same one-line :class:`~collapipe_flwr.errors.ConfigError`, worded with the
caller's name for each value.

Which optimizer uses what (Flower's strategies): ``lr`` (eta) every one but FedAvg; ``momentum`` (FedAvgM's
momentum, FedAdam/FedYogi's beta_1) FedAvgM, FedAdam, FedYogi; ``beta_2`` FedAdam, FedYogi; ``tau``
FedAdam, FedYogi, FedAdagrad.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice, require


class ServerOptimizerName(StrEnum):
    """``federation.server_optimizer``: the Flower strategy whose maths update the aggregated parts."""

    FEDAVG = "fedavg"
    FEDAVGM = "fedavgm"
    FEDADAM = "fedadam"
    FEDYOGI = "fedyogi"
    FEDADAGRAD = "fedadagrad"


SERVER_OPTIMIZERS = tuple(ServerOptimizerName)
_ADAPTIVE = (ServerOptimizerName.FEDADAM, ServerOptimizerName.FEDYOGI)


def _finite(value: object, key: str) -> float:
    """``value`` as a float; a ConfigError unless it is a finite int or float (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} is not a finite number; set a float")
    return float(value)


@dataclass(frozen=True)
class HyperRule:
    """One hyper-parameter: the optimizers that use it and the range it must lie in."""

    name: str  # ServerOptimizer's argument; the config's field is server_<name>
    used_by: tuple[ServerOptimizerName, ...]
    within: Callable[[float], bool]
    requirement: str  # the range, as the message states it
    hint: str  # how to fix it

    def check(self, value: object, key: str, optimizer: ServerOptimizerName) -> None:
        """A one-line ConfigError unless ``value`` (named ``key``) is a finite number in range."""
        scope = f" for {optimizer}" if optimizer in self.used_by else ""
        require(self.within(_finite(value, key)), f"{key}={value} must be {self.requirement}{scope}; {self.hint}")


HYPER_RULES = (
    HyperRule(
        "lr",
        (ServerOptimizerName.FEDAVGM, *_ADAPTIVE, ServerOptimizerName.FEDADAGRAD),
        lambda v: v > 0,
        "> 0",
        "set a positive server learning rate",
    ),
    HyperRule("momentum", (ServerOptimizerName.FEDAVGM, *_ADAPTIVE), lambda v: 0 <= v < 1, "in [0, 1)", "e.g. 0.9"),
    HyperRule("beta_2", _ADAPTIVE, lambda v: 0 <= v < 1, "in [0, 1)", "e.g. 0.99"),
    HyperRule("tau", (*_ADAPTIVE, ServerOptimizerName.FEDADAGRAD), lambda v: v > 0, "> 0", "e.g. 1e-3"),
)


def check_server_optimizer(
    name: object, hyper: Mapping[str, object], name_key: str, key_of: Callable[[str], str], used_only: bool
) -> ServerOptimizerName:
    """``name`` as its :class:`ServerOptimizerName`; a one-line ConfigError unless it is one and the
    hyper-parameters in ``hyper`` (by :attr:`HyperRule.name`) are in range: every one, or with ``used_only`` those
    ``name`` uses.

    ``name_key`` names the optimizer in the messages, ``key_of(rule.name)`` a hyper-parameter.
    """
    optimizer = choice(name_key, name, ServerOptimizerName)
    for rule in HYPER_RULES:
        if not used_only or optimizer in rule.used_by:
            rule.check(hyper[rule.name], key_of(rule.name), optimizer)
    return optimizer
