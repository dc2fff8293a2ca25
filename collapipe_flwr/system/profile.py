"""What was measured on a cluster's real devices and links: the numbers DSSRA plans from under
``system.profile: measured`` (the alternative to the constants of ``conf/network/``).

A device actor times the forward + backward of one TEB at the micro-batch sizes Sub-1 may choose and fits

    t_k(b_hat) = c0_k + b_hat * s_k          (seconds for one block, one micro-batch)

so a chunk of delta_k blocks costs ``delta_k b_hat s_k + c0_k``: eq. (15)'s ``delta_k b_hat (o_l + o'_l) /
(phi_k f_k)`` with the measured ``phi_k f_k = (o_l + o'_l) / s_k``, plus the per-micro-batch cost c0 of
docs/system_model.md (measured per device instead of one constant). c0_k is a per-block fit, charged once per
chunk in the model; with the few blocks of these encoders the difference is inside the fit's noise.

Each link k -> k+1 (and the last device's hand-over to its CU) is timed with two payload sizes on the
transport the pipeline really uses (Ray's object store between actors) and fitted to ``latency + bytes /
rate``: eq. (13)'s r_k^dd and the per-transfer latency tau_0. The CU adds the time its own part of a step
takes outside the devices (embedding, the data-plane exchange with the server's decoder, the update), minus the
emulated radio time of z_enc when the testbed throttles the uplink: eq. (26) has no term for it, so it is
reported apart (``overhead_s``).

Pure data and arithmetic: the measuring itself is in ``pipeline/profiling.py`` (on the devices) and
``fl/`` (the CU and the server's :class:`ProfileStore` that smooths the reports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from collapipe_flwr.errors import CollaPipeError


class ProfileError(CollaPipeError):
    """A measured profile (from a CU's reply or a fit) is malformed or physically impossible."""


def _positive(name: str, value: Any, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"profile value {name}={value!r} must be a number")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        raise ProfileError(f"profile value {name}={value!r} must be finite and {'>= 0' if allow_zero else '> 0'}")
    return x


@dataclass(frozen=True)
class DeviceMeasurement:
    """Device k: s_k (seconds per sample per block, forward + backward), c0_k (seconds per micro-batch per
    block) and the memory it may use (bytes, gamma_k^max of C7)."""

    seconds_per_sample_block: float
    microbatch_s: float
    memory_bytes: float

    def __post_init__(self) -> None:
        _positive("seconds_per_sample_block", self.seconds_per_sample_block)
        _positive("microbatch_s", self.microbatch_s, allow_zero=True)
        _positive("memory_bytes", self.memory_bytes)


@dataclass(frozen=True)
class LinkMeasurement:
    """The hand-over out of device k: r_k^dd (bytes/s) and the fixed latency of one transfer tau_0 (s)."""

    bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        _positive("bytes_per_s", self.bytes_per_s)
        _positive("latency_s", self.latency_s, allow_zero=True)


@dataclass(frozen=True)
class ClusterProfile:
    """Cluster n's measured devices (None = not measured yet: e.g. an actor that could not be reached), the
    link out of each device, and the CU's own time per step outside the devices (s)."""

    devices: tuple[DeviceMeasurement | None, ...]
    links: tuple[LinkMeasurement | None, ...]
    cu_step_s: float = 0.0
    measured_round: int = 0

    def __post_init__(self) -> None:
        if len(self.links) != len(self.devices):
            raise ProfileError(
                f"profile has {len(self.devices)} devices but {len(self.links)} links; one link per device"
            )
        _positive("cu_step_s", self.cu_step_s, allow_zero=True)

    @property
    def K(self) -> int:
        return len(self.devices)

    def to_dict(self) -> dict:
        return {
            "devices": [asdict(d) if d else None for d in self.devices],
            "links": [asdict(link) if link else None for link in self.links],
            "cu_step_s": self.cu_step_s,
            "measured_round": self.measured_round,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ClusterProfile:
        """Inverse of :meth:`to_dict`; anything malformed is a one-line :class:`ProfileError`."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"profile must be a mapping, got {type(data).__name__}")
        try:
            devices = tuple(DeviceMeasurement(**d) if d is not None else None for d in data["devices"])
            links = tuple(LinkMeasurement(**x) if x is not None else None for x in data["links"])
            return cls(devices, links, float(data.get("cu_step_s", 0.0)), int(data.get("measured_round", 0)))
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, ProfileError):
                raise
            raise ProfileError(f"malformed profile ({err}); the CU and server run different versions") from None


@dataclass(frozen=True)
class DeviceEmulation:
    """What the testbed imposes on cluster n's devices in round t (one entry per device k): a CPU quota in cores
    (0 = none), the outgoing link's rate (bytes/s, 0 = unthrottled) and per-transfer latency, and the CU's
    uplink rate (bytes/s) for the Shannon rate of the channel and power DSSRA chose (0 = unthrottled), and each
    device's memory limit gamma_k^max in bytes (C7, ``testbed.memory_limit``; () = no limits)."""

    cpu_cores: tuple[float, ...]
    d2d_bytes_per_s: tuple[float, ...]
    d2d_latency_s: tuple[float, ...]
    uplink_bytes_per_s: float = 0.0
    memory_bytes: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceEmulation:
        try:
            return cls(
                tuple(float(x) for x in data["cpu_cores"]),
                tuple(float(x) for x in data["d2d_bytes_per_s"]),
                tuple(float(x) for x in data["d2d_latency_s"]),
                float(data.get("uplink_bytes_per_s", 0.0)),
                tuple(float(x) for x in data.get("memory_bytes", ())),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ProfileError(
                f"malformed testbed settings ({err}); the CU and server run different versions"
            ) from None


# ----------------------------------------------------------------------------- fits
def fit_chunk_cost(samples: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``t = c0 + s * b_hat`` over the timed micro-batch sizes -> (c0 >= 0, s > 0)."""
    x = np.asarray(samples, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.size < 2 or np.unique(x).size < 2:
        raise ProfileError("a compute fit needs timings at two or more micro-batch sizes")
    slope, intercept = np.polyfit(x, y, 1)
    if not slope > 0:  # noise swamped the size dependence: charge it all per sample
        return 0.0, float(y.mean() / x.mean())
    if intercept < 0:  # a negative fixed cost is noise: refit through the origin
        return 0.0, float(np.dot(x, y) / np.dot(x, x))
    return float(intercept), float(slope)


def fit_link(nbytes: Sequence[float], seconds: Sequence[float]) -> LinkMeasurement:
    """``t = latency + bytes / rate`` from transfers of two or more sizes."""
    c0, s = fit_chunk_cost(nbytes, seconds)
    return LinkMeasurement(bytes_per_s=1.0 / s, latency_s=c0)


# ----------------------------------------------------------------------------- smoothing
def _blend(old: float, new: float, alpha: float) -> float:
    return (1.0 - alpha) * old + alpha * new


def smooth(old: ClusterProfile | None, new: ClusterProfile, alpha: float) -> ClusterProfile:
    """Exponential smoothing of a fresh report into the kept profile, field by field (``alpha`` = the new
    report's weight; 1 keeps only the newest). A device or link measured in only one of them keeps that one."""
    if old is None or old.K != new.K or alpha >= 1.0:
        return new

    def mix(a, b):
        if a is None or b is None:
            return b if b is not None else a
        return type(b)(**{f: _blend(getattr(a, f), getattr(b, f), alpha) for f in asdict(b)})

    measured_now = any(d is not None for d in new.devices)
    return replace(
        new,
        devices=tuple(mix(a, b) for a, b in zip(old.devices, new.devices)),
        links=tuple(mix(a, b) for a, b in zip(old.links, new.links)),
        cu_step_s=_blend(old.cu_step_s, new.cu_step_s, alpha),
        measured_round=new.measured_round if measured_now else old.measured_round,
    )


@dataclass
class ProfileStore:
    """The server's view of every cluster's measured profile: smoothed reports, and which clusters are due for
    a new measurement (every ``refresh_every`` rounds after their last; 0 = measure once)."""

    refresh_every: int = 5
    alpha: float = 0.5
    profiles: dict[int, ClusterProfile] = field(default_factory=dict)

    def due(self, cluster: int, t: int) -> bool:
        """Whether cluster n should measure its devices in round t."""
        kept = self.profiles.get(cluster)
        if kept is None or all(d is None for d in kept.devices):
            return True
        return self.refresh_every > 0 and t - kept.measured_round >= self.refresh_every

    def update(self, cluster: int, report: ClusterProfile) -> ClusterProfile:
        self.profiles[cluster] = smooth(self.profiles.get(cluster), report, self.alpha)
        return self.profiles[cluster]

    def get(self, cluster: int) -> ClusterProfile | None:
        return self.profiles.get(cluster)

    def state_dict(self) -> dict:
        return {str(n): p.to_dict() for n, p in self.profiles.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.profiles = {int(n): ClusterProfile.from_dict(p) for n, p in state.items()}
