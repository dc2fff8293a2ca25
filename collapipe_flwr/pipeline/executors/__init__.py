"""Where the stages run: in this process (``local.LocalStages``) or one Ray actor per device
(``ray_stages.RayStages``), with the cores each actor gets (``cores``).

The CU's driver (``pipeline/cluster.py`` and its parts) is backend-neutral: everything it does with a device goes
through the typed methods of the :class:`~collapipe_flwr.pipeline.executors.interface.Stages` interface, so only
``ray_actor``, ``ray_calls`` and ``ray_stages`` know Ray actors (an import-linter contract in pyproject.toml keeps
Ray's import to ``ray_actor`` and ``ray_stages``).
"""

from __future__ import annotations

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.executors.cores import core_sets, default_actor_threads, usable_cores, usable_cores_list
from collapipe_flwr.pipeline.executors.interface import Stages, StageSpec
from collapipe_flwr.pipeline.executors.local import LocalStages
from collapipe_flwr.pipeline.executors.ray_actor import creation_error, release
from collapipe_flwr.pipeline.executors.ray_stages import RayStages
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import Backend, ClusterRuntime

__all__ = [
    "LocalStages",
    "RayStages",
    "StageSpec",
    "Stages",
    "core_sets",
    "creation_error",
    "default_actor_threads",
    "open_stages",
    "release",
    "usable_cores",
    "usable_cores_list",
]


def open_stages(
    runtime: ClusterRuntime, optimizer: OptimizerSpec, *, num_devices: int = 0, segments: int = 1
) -> Stages:
    """The (empty) stages of one cluster of ``num_devices`` devices, about to hold ``segments`` segments, on
    ``runtime.spec.backend``."""
    match runtime.spec.backend:
        case Backend.LOCAL:
            return LocalStages([], optimizer, runtime)
        case Backend.RAY:
            return RayStages([], optimizer, runtime, num_devices=num_devices, segments=segments)
    raise ConfigError(f"runtime.backend={runtime.spec.backend!r} must be one of {', '.join(Backend)}")
