"""The scheduler section (conf/scheduler/*.yaml), validated once into a frozen SchedulerSpec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from collapipe_flwr.errors import ConfigError

POLICIES = ("dssra", "uniform", "random", "loss_only", "delay_only")
DRIFTS = ("gamma", "paper")
_KEYS = ("name", "V", "segment_scheduling", "fixed_m", "max_m", "drift", "bcd_max_iters", "convergence")
_CONV_KEYS = ("beta", "eta", "grad_bound", "interference_c", "gamma_max")


@dataclass(frozen=True)
class SchedulerSpec:
    """name: policy; V: Lyapunov control factor; segment_scheduling: Sub-1 on (else equal blocks over all K
    with m = fixed_m); max_m: largest m tried (0 = b); drift: 'gamma' (Y_n Gamma_n, default) or 'paper'
    (Y_n (S + p_n), eq. 32 as printed); convergence: beta, eta, grad_bound (phi), interference_c (C),
    gamma_max (Gamma^max) of eqs. (28)-(29)."""

    name: str
    V: float
    segment_scheduling: bool
    fixed_m: int
    max_m: int
    drift: str
    bcd_max_iters: int
    beta: float
    eta: float
    grad_bound: float
    interference_c: float
    gamma_max: float


def _num(raw: Mapping, key: str, where: str, default: Any = None, positive: bool = False, nonneg: bool = False) -> float:
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


def _int(raw: Mapping, key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"scheduler.{key}={value!r} must be an integer >= {minimum}")
    return value


def parse_scheduler_config(scheduler: Mapping[str, Any]) -> SchedulerSpec:
    if not isinstance(scheduler, Mapping):
        raise ConfigError("scheduler config must be a mapping; pick scheduler=<name> (see conf/scheduler/)")
    unknown = sorted(set(scheduler) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown key scheduler.{unknown[0]}; valid keys are {', '.join(_KEYS)}")
    name = scheduler.get("name")
    if name not in POLICIES:
        raise ConfigError(f"scheduler.name={name!r} is not one of {', '.join(POLICIES)}; pick scheduler=<name>")
    seg = scheduler.get("segment_scheduling", name != "uniform")
    if not isinstance(seg, bool):
        raise ConfigError(f"scheduler.segment_scheduling={seg!r} must be true or false")
    if name == "uniform":
        seg = False
    drift = scheduler.get("drift", "gamma")
    if drift not in DRIFTS:
        raise ConfigError(f"scheduler.drift={drift!r} must be one of {', '.join(DRIFTS)}")
    conv = scheduler.get("convergence", {})
    if not isinstance(conv, Mapping):
        raise ConfigError("scheduler.convergence must be a mapping with beta, eta, grad_bound, interference_c, gamma_max")
    unknown = sorted(set(conv) - set(_CONV_KEYS))
    if unknown:
        raise ConfigError(f"unknown key scheduler.convergence.{unknown[0]}; valid keys are {', '.join(_CONV_KEYS)}")
    where = "scheduler.convergence"
    return SchedulerSpec(
        name=str(name),
        V=_num(scheduler, "V", "scheduler", positive=True),
        segment_scheduling=seg,
        fixed_m=_int(scheduler, "fixed_m", 4, 1),
        max_m=_int(scheduler, "max_m", 0, 0),
        drift=str(drift),
        bcd_max_iters=_int(scheduler, "bcd_max_iters", 5, 1),
        beta=_num(conv, "beta", where, 1.0, positive=True),
        eta=_num(conv, "eta", where, 0.1, positive=True),
        grad_bound=_num(conv, "grad_bound", where, 1.0, positive=True),
        interference_c=_num(conv, "interference_c", where, 0.01, nonneg=True),
        gamma_max=_num(conv, "gamma_max", where, positive=True),
    )
