"""Training methods by name: ``method.name`` -> the planner factory registered by a module of
:mod:`collapipe_flwr.dssra.methods`.

Adding a method is one module in ``collapipe_flwr/dssra/methods/`` whose factory is decorated with
``@register_method("<name>")`` plus one ``conf/method/<name>.yaml``; nothing here changes. :data:`METHODS`
imports every module of that package (``pkgutil``) the first time it is read, so the table is complete
whatever was imported before. This module imports no other dssra module at run time (the specs and the
Policy appear in annotations only), so :mod:`collapipe_flwr.dssra.specs` can check ``method.name`` here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

from collapipe_flwr.errors import ConfigError

if TYPE_CHECKING:
    from collapipe_flwr.dssra.policies import Policy
    from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec
    from collapipe_flwr.system.network import NetworkSpec
    from collapipe_flwr.system.workload import Workload

__all__ = ["METHODS", "PlannerFactory", "make_planner", "register_method"]

_PACKAGE = "collapipe_flwr.dssra.methods"

# (method, scheduler, network, workload, seed) -> the Policy that plans every round of this method
PlannerFactory = Callable[["MethodSpec", "SchedulerSpec", "NetworkSpec", "Workload", int], "Policy"]
_F = TypeVar("_F", bound=PlannerFactory)

_FACTORIES: dict[str, PlannerFactory] = {}
_discovered = False


def _qualified(factory: PlannerFactory) -> str:
    return f"{factory.__module__}.{factory.__qualname__}"


def register_method(*names: str) -> Callable[[_F], _F]:
    """Decorator: make ``factory`` the planner of every ``method.name`` in ``names``."""

    def register(factory: _F) -> _F:
        for name in names:
            known = _FACTORIES.get(name)
            if known is not None and _qualified(known) != _qualified(factory):
                raise ValueError(
                    f"training method {name!r} is registered twice: {_qualified(known)}, {_qualified(factory)}"
                )
            _FACTORIES[name] = factory
        return factory

    return register


def _discover() -> None:
    """Import every module of collapipe_flwr.dssra.methods once, so each registers its methods."""
    global _discovered
    if _discovered:
        return
    package = importlib.import_module(_PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        importlib.import_module(f"{_PACKAGE}.{info.name}")
    _discovered = True


class _MethodRegistry(Mapping):
    """method.name -> planner factory, for every method registered in collapipe_flwr.dssra.methods."""

    def __getitem__(self, name: str) -> PlannerFactory:
        _discover()
        return _FACTORIES[name]

    def __iter__(self) -> Iterator[str]:
        _discover()
        return iter(sorted(_FACTORIES))

    def __len__(self) -> int:
        _discover()
        return len(_FACTORIES)


METHODS: Mapping[str, PlannerFactory] = _MethodRegistry()


def make_planner(
    method: MethodSpec, scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int
) -> Policy:
    """The planner of ``method`` (conf/method/*.yaml) under the scheduling policy ``scheduler`` (conf/scheduler)."""
    try:
        factory = METHODS[method.name]
    except KeyError:
        raise ConfigError(f"method.name={method.name!r} has no planner; pick one of {', '.join(METHODS)}") from None
    return factory(method, scheduler, network, workload, seed)
