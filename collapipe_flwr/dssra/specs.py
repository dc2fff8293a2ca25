"""The two config sections this package owns, each parsed once into a frozen spec.

* ``method`` (conf/method/*.yaml) -> :class:`MethodSpec` by :func:`parse_method`: which training method
  plans the rounds (a name registered in :data:`~collapipe_flwr.dssra.method_registry.METHODS`) and how it
  differs from CollaPipe.
* ``scheduler`` (conf/scheduler/*.yaml) -> :class:`SchedulerSpec` by :func:`parse_scheduler`: the scheduling
  policy (a name registered in :data:`~collapipe_flwr.dssra.selectors.SELECTORS`), V, Sub-1's search space
  and the convergence constants of eqs. (28)-(29).

Both raise a one-line :class:`~collapipe_flwr.errors.ConfigError` naming the key; ``spec.to_raw()`` gives
the YAML shape back, so ``parse(spec.to_raw()) == spec``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.dssra.method_registry import METHODS
from collapipe_flwr.dssra.selectors import SELECTORS
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice, choices, require, typed

__all__ = ["DRIFTS", "Drift", "MethodSpec", "SchedulerSpec", "parse_method", "parse_scheduler"]


class Drift(StrEnum):
    """``scheduler.drift``: the Lyapunov drift term of Sub-1 / Sub-2, Y_n Gamma_n (``gamma``) or Y_n (S + p_n)
    (``paper``, eq. 32 as printed)."""

    GAMMA = "gamma"
    PAPER = "paper"


DRIFTS = tuple(Drift)
_KEYS = ("name", "V", "segment_scheduling", "fixed_m", "max_m", "drift", "bcd_max_iters", "convergence")
_CONV_KEYS = ("beta", "eta", "grad_bound", "interference_c", "gamma_max")
GAMMA_MAX_AUTO = 0.0  # scheduler.convergence.gamma_max: auto


# ----------------------------------------------------------------------------- method
@dataclass(frozen=True)
class MethodSpec:
    """How a training method differs from CollaPipe: only the plan and the aggregation.

    name: a registered method (collapipe_flwr/dssra/methods/).  segment_scheduling: Sub-1 chooses delta, S, m
    (else equal blocks over all K devices with m = fixed_m; fixed_m = 0: Sub-1 still chooses m for that
    split, only the segment scheduling is off).  head_on_server: split learning against the
    server's head (the CU uploads z_enc every step).  aggregate: FedAvg of the encoder and embedding.
    """

    name: str = "collapipe"
    segment_scheduling: bool = True
    fixed_m: int = 4
    head_on_server: bool = True
    aggregate: bool = True

    def __post_init__(self) -> None:
        require(
            self.name in METHODS, f"method.name={self.name!r} is not one of {', '.join(METHODS)}; pick method=<name>"
        )
        require(self.fixed_m >= 0, f"method.fixed_m={self.fixed_m} must be >= 0 (0: m chosen by Sub-1)")

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


def parse_method(raw: Any) -> MethodSpec:
    """conf/method/*.yaml -> MethodSpec (one-line ConfigError on a bad key or value)."""
    return typed("method", MethodSpec, raw)


# ----------------------------------------------------------------------------- scheduler
@dataclass(frozen=True)
class SchedulerSpec:
    """name: policy; V: Lyapunov control factor; segment_scheduling: Sub-1 on (else equal blocks over all K
    with m = fixed_m); max_m: largest m tried (0 = b); drift: 'gamma' (Y_n Gamma_n, default) or 'paper'
    (Y_n (S + p_n), eq. 32 as printed); convergence: beta, eta, grad_bound (phi), interference_c (C),
    gamma_max (Gamma^max) of eqs. (28)-(29); ``GAMMA_MAX_AUTO`` (0.0, ``auto`` in YAML) = calibrated for the run's
    own N, L, J and network when its policy is built (system/convergence.calibrated_gamma_max_for)."""

    name: str
    V: float
    segment_scheduling: bool
    fixed_m: int
    max_m: int
    drift: Drift
    bcd_max_iters: int
    beta: float
    eta: float
    grad_bound: float
    interference_c: float
    gamma_max: float

    def __post_init__(self) -> None:
        choices(self, "scheduler", drift=Drift)

    @property
    def gamma_max_auto(self) -> bool:
        """Whether Gamma^max is calibrated for the run's setting (``gamma_max: auto``)."""
        return self.gamma_max == GAMMA_MAX_AUTO

    def to_raw(self) -> dict[str, Any]:
        """The YAML shape: the convergence constants nested under ``convergence``."""
        flat = asdict(self)
        conv = {key: flat.pop(key) for key in _CONV_KEYS}
        if self.gamma_max_auto:
            conv["gamma_max"] = "auto"
        return {**flat, "convergence": conv}


def _num(
    raw: Mapping, key: str, where: str, default: Any = None, positive: bool = False, nonneg: bool = False
) -> float:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}.{key} is missing; copy it from conf/scheduler/dssra.yaml")
    if isinstance(value, bool):
        raise ConfigError(f"{where}.{key}={value!r} must be a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.{key}={value!r} must be a number") from None
    if (positive and not x > 0) or (nonneg and not x >= 0):
        raise ConfigError(f"{where}.{key}={value!r} must be {'> 0' if positive else '>= 0'}")
    return x


def _gamma_max(conv: Mapping, where: str) -> float:
    """``gamma_max``: a number > 0, or ``auto`` (GAMMA_MAX_AUTO: calibrated for the run's setting)."""
    if conv.get("gamma_max") == "auto":
        return GAMMA_MAX_AUTO
    try:
        return _num(conv, "gamma_max", where, positive=True)
    except ConfigError as err:
        raise ConfigError(f"{err} or auto (calibrated for the run's N, L and J, docs/system_model.md)") from None


def _int(raw: Mapping, key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"scheduler.{key}={value!r} must be an integer >= {minimum}")
    return value


def parse_scheduler(raw: Any) -> SchedulerSpec:
    """conf/scheduler/*.yaml -> SchedulerSpec (one-line ConfigError on a bad key or value). A policy that
    forces segment scheduling (``uniform``: off) overrides ``scheduler.segment_scheduling``."""
    if not isinstance(raw, Mapping):
        raise ConfigError("scheduler config must be a mapping; pick scheduler=<name> (see conf/scheduler/)")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown key scheduler.{unknown[0]}; valid keys are {', '.join(_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or name not in SELECTORS:
        raise ConfigError(f"scheduler.name={name!r} is not one of {', '.join(SELECTORS)}; pick scheduler=<name>")
    forced = SELECTORS[name].segment_scheduling
    seg = raw.get("segment_scheduling", True if forced is None else forced)
    if not isinstance(seg, bool):
        raise ConfigError(f"scheduler.segment_scheduling={seg!r} must be true or false")
    if forced is not None:
        seg = forced
    drift = choice("scheduler.drift", raw.get("drift", Drift.GAMMA), Drift)
    conv = raw.get("convergence", {})
    if not isinstance(conv, Mapping):
        raise ConfigError(f"scheduler.convergence must be a mapping with {', '.join(_CONV_KEYS)}")
    unknown = sorted(set(conv) - set(_CONV_KEYS))
    if unknown:
        raise ConfigError(f"unknown key scheduler.convergence.{unknown[0]}; valid keys are {', '.join(_CONV_KEYS)}")
    where = "scheduler.convergence"
    return SchedulerSpec(
        name=str(name),
        V=_num(raw, "V", "scheduler", positive=True),
        segment_scheduling=seg,
        fixed_m=_int(raw, "fixed_m", 4, 0),
        max_m=_int(raw, "max_m", 0, 0),
        drift=drift,
        bcd_max_iters=_int(raw, "bcd_max_iters", 5, 1),
        beta=_num(conv, "beta", where, 1.0, positive=True),
        eta=_num(conv, "eta", where, 0.1, positive=True),
        grad_bound=_num(conv, "grad_bound", where, 1.0, positive=True),
        interference_c=_num(conv, "interference_c", where, 0.01, nonneg=True),
        gamma_max=_gamma_max(conv, where),
    )
