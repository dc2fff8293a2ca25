"""Raw config mapping -> frozen spec dataclass, the one parser every config section uses.

Each package owns the spec of its section (``tasks/spec.py``: TaskSpec, ModelSpec; ``dssra/specs.py``:
MethodSpec, SchedulerSpec; ``system/network.py``: NetworkSpec; ``pipeline/runtime_spec.py``: RuntimeSpec;
``config.py``: the run-level FederationSpec, DataPlaneSpec, EvalSpec) and parses its raw mapping with
:func:`typed`; :mod:`collapipe_flwr.config` composes the sections. This module sits at the bottom of the
import graph: it knows dataclasses and :class:`~collapipe_flwr.errors.ConfigError`, nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from collapipe_flwr.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
E = TypeVar("E", bound=StrEnum)

_SCALARS: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def require(cond: bool, message: str) -> None:
    """Raise a one-line ConfigError with ``message`` unless ``cond``."""
    if not cond:
        raise ConfigError(message)


def choice(key: str, value: Any, options: type[E]) -> E:
    """``value`` (a member, or its string as read from YAML, a run_config or a saved config.json) as the member
    of the option's StrEnum ``options``; anything else a one-line ConfigError naming ``key`` and the choices."""
    if isinstance(value, options):
        return value
    try:
        return options(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{key}={value!r} must be one of {', '.join(options)}") from None


def choices(spec: Any, section: str, **options: type[StrEnum]) -> None:
    """In ``__post_init__`` of frozen dataclass ``spec``: each named field as its member of the StrEnum given
    for it (:func:`choice`, the key ``section.field``), so every spec holds members however it was built."""
    for name, enum in options.items():
        object.__setattr__(spec, name, choice(f"{section}.{name}", getattr(spec, name), enum))


def mapping(section: str, raw: Any) -> dict[str, Any]:
    """``raw`` as a plain dict; a one-line error naming ``section`` when it is not a mapping."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config section {section} must be a mapping, got {type(raw).__name__}")
    return dict(raw)


def check_keys(section: str, raw: Mapping[str, Any], known: tuple[str, ...] | set[str] | frozenset[str]) -> None:
    """Unknown keys of ``section`` are a one-line ConfigError listing the valid ones."""
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config key {section}.{unknown[0]}; valid keys of {section} are {', '.join(sorted(known))}"
        )


def scalar(section: str, name: str, value: Any, want: type) -> Any:
    """``value`` checked against ``want`` (bool, int, float or str); ints are accepted as floats."""
    key = f"{section}.{name}" if section else name
    if want is bool and not isinstance(value, bool):
        raise ConfigError(f"config key {key}={value!r} must be true or false")
    if want is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config key {key}={value!r} must be an integer")
    if want is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key}={value!r} must be a number")
        return float(value)
    if want is str:
        return "" if value is None else str(value)
    return value


def typed(section: str, cls: type[T], raw: Any) -> T:
    """Build dataclass ``cls`` from mapping ``raw``: unknown keys and wrong scalar types are one-line
    ConfigErrors; absent keys take the dataclass defaults; ``__post_init__`` checks ranges."""
    raw = mapping(section, raw)
    known = {f.name: f for f in dataclasses.fields(cls)}
    check_keys(section, raw, set(known))
    kwargs = {}
    for name, f in known.items():
        if name not in raw:
            continue
        want = f.type if isinstance(f.type, type) else _SCALARS.get(str(f.type))
        kwargs[name] = scalar(section, name, raw[name], want) if want is not None else raw[name]
    return cls(**kwargs)
