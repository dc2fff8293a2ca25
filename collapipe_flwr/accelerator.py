"""Where a role's tensors compute: ``runtime.device`` (``auto`` | ``cpu`` | ``cuda``), resolved in the process
that does the work.

Roles and their keys (conf/config.yaml):

* each device stage (a Ray actor or an in-process stage): ``runtime.device``, resolved *inside* the actor,
  so a CU box without a GPU can drive device boxes that have one; with ``runtime.actor_num_gpus`` > 0 Ray
  gives each actor that fraction of a GPU (several stages can share one GPU);
* the server's decoder / task head and the server's evaluation: ``runtime.server_device`` ("" = the same
  as ``runtime.device``);
* ``train_central`` and ``evaluate``: ``--device``.

The CU's embedding stays on the CU's CPU (a control unit is a small edge box). Activations cross between
stages (through Ray's object store) and over the data plane as CPU tensors; inside one process they stay
on the device. CPU stays the default on a machine without CUDA: ``auto`` resolves to ``cpu`` there and
nothing moves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice


class Device(StrEnum):
    """``runtime.device`` / ``runtime.server_device`` / ``--device``: where a role's tensors compute."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


DEVICES = tuple(Device)


def resolve_device(name: str, key: str = "runtime.device") -> torch.device:
    """``auto`` -> cuda when this process sees a CUDA GPU, else cpu; ``cuda`` without one is a ConfigError."""
    device = choice(key, name, Device)
    if device is Device.CPU:
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if device is Device.AUTO and not available:
        return torch.device("cpu")
    if not available:
        raise ConfigError(
            f"{key}=cuda but this process sees no CUDA GPU (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'none'}); use {key}=auto or cpu, or install a CUDA build of torch"
        )
    return torch.device("cuda", torch.cuda.current_device())  # indexed, so it compares equal to a parameter's


def check_gpu_share(actor_num_gpus: float, devices_per_cu: int, cus_at_once: int, gpus: int) -> None:
    """Refuse GPU shares that cannot all be granted at once on this machine.

    Ray starts a device actor only once it can reserve ``runtime.actor_num_gpus`` of a GPU; an actor that can
    never get it stays pending, so its CU waits out the actor start timeout while the other CUs train (seen
    on an H100 with 2 CUs x 3 devices x 0.25). A CU's device actors live for the whole run (started with the
    first round, or kept once a plan used them), so ``cus_at_once`` CUs hold ``devices_per_cu`` actors each and
    the run needs
    actor_num_gpus x devices_per_cu x cus_at_once <= gpus. Raises a ConfigError naming the largest share
    that fits.
    """
    actors = max(devices_per_cu, 1) * max(cus_at_once, 1)
    demand = actor_num_gpus * actors
    if actor_num_gpus > 0 and demand > gpus + 1e-9:
        fits = math.floor(gpus / actors * 1000) / 1000
        raise ConfigError(
            f"runtime.actor_num_gpus={actor_num_gpus:g} x {devices_per_cu} devices per CU x {cus_at_once} CUs "
            f"training at once = {demand:g} GPUs, but this machine has {gpus}; set runtime.actor_num_gpus<={fits:g} "
            "(or fewer CUs at once with runtime.concurrent_cus)"
        )


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (cpu for a module without parameters)."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def batch_to(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with every tensor on ``device`` (non-tensor values kept); no copy when already there."""
    non_blocking = device.type == "cuda"
    return {k: (v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v) for k, v in batch.items()}


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU (what crosses a process boundary); the same tensor when it is there already."""
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")
