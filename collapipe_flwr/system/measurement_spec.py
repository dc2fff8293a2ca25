"""The ``system`` and ``testbed`` config sections: where DSSRA's device and link numbers come from, and what the
emulated heterogeneous testbed imposes on the devices and links (docs/testbed.md).

``system.profile: config`` plans from ``conf/network/`` as the paper does; ``measured`` from what each CU
measures on its devices (system/profile.py), refreshed every ``refresh_every`` rounds and smoothed. The testbed
(``testbed=emulated``) makes the configured heterogeneity real on one Linux machine: each device actor under a
cgroup CPU quota proportional to its configured phi_k f_k, each D2D hand-over and the CU's uplink through a
token bucket at the rate the system model gives.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.spec_parsing import choices, require, typed


class ProfileMode(StrEnum):
    """``system.profile``: DSSRA plans from the configured network (as the paper does) or from measurements."""

    CONFIG = "config"
    MEASURED = "measured"


@dataclass(frozen=True)
class SystemSpec:
    """profile: ``config`` | ``measured``; refresh_every: rounds between a cluster's measurements (0 = once);
    smoothing: the weight of a new measurement in the kept profile (1 = keep only the newest); repeats: timed
    calls per micro-batch size and transfer size."""

    profile: ProfileMode = ProfileMode.CONFIG
    refresh_every: int = 5
    smoothing: float = 0.5
    repeats: int = 3

    def __post_init__(self) -> None:
        choices(self, "system", profile=ProfileMode)
        require(self.refresh_every >= 0, f"system.refresh_every={self.refresh_every} must be >= 0 (0 = measure once)")
        require(0 < self.smoothing <= 1, f"system.smoothing={self.smoothing} must be in (0, 1]")
        require(self.repeats >= 1, f"system.repeats={self.repeats} must be >= 1")

    @property
    def measured(self) -> bool:
        return self.profile is ProfileMode.MEASURED

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TestbedSpec:
    """enabled: emulate the configured network on this machine; fastest_cores: the CPU quota (cores) of the
    fastest device of the network, every other device k getting fastest_cores x phi_k f_k / max phi f;
    cpu_quota / d2d / uplink: which of the three the testbed imposes; d2d_rate_scale: multiplies the modelled
    r_k^dd before throttling (1 = the system model's rate); cpu_cores: explicit cores per device k (the same for
    every cluster) instead of the configured speeds, for a testbed whose devices differ from what the network
    preset says (the value of measuring: ``system.profile: config`` then plans from wrong numbers);
    memory_limit: each device process under a memory cgroup limit of its gamma_k^max (C7 made real,
    ``testbed/memory_limit.py``): a device over it is killed by the kernel and reported as a memory failure."""

    __test__ = False  # not a pytest test class despite its name

    enabled: bool = False
    cpu_quota: bool = True
    fastest_cores: float = 1.0
    d2d: bool = True
    uplink: bool = True
    d2d_rate_scale: float = 1.0
    cpu_cores: tuple[float, ...] = ()
    memory_limit: bool = True

    def __post_init__(self) -> None:
        cores = self.cpu_cores
        require(
            isinstance(cores, (list, tuple))
            and all(isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in cores),
            f"testbed.cpu_cores={cores!r} must be a list of core counts > 0, one per device (or [] for the speeds)",
        )
        object.__setattr__(self, "cpu_cores", tuple(float(c) for c in cores))
        require(self.fastest_cores > 0, f"testbed.fastest_cores={self.fastest_cores} must be > 0")
        if self.enabled:  # the testbed throttles this machine's cores: a quota above them throttles nothing
            have = machine_cores()
            most = max((self.fastest_cores, *self.cpu_cores))
            require(
                most <= have,
                f"testbed cores {most:g} exceed this machine's {have} usable cores; lower testbed.fastest_cores "
                "(and testbed.cpu_cores) to at most the machine's cores",
            )
        require(self.d2d_rate_scale > 0, f"testbed.d2d_rate_scale={self.d2d_rate_scale} must be > 0")

    def to_raw(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_cores": list(self.cpu_cores)}


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity), which the testbed's CPU quotas divide."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: the testbed itself refuses to start there
        return os.cpu_count() or 1


def parse_system(raw: Any) -> SystemSpec:
    return typed("system", SystemSpec, raw)


def parse_testbed(raw: Any) -> TestbedSpec:
    return typed("testbed", TestbedSpec, raw)
