"""The static network of a run: J channels, N clusters of K devices, radio and energy limits (Table II).

``NetworkSpec.from_config(network, num_clusters)`` reads a ``conf/network/*.yaml`` mapping. A value given
as ``[lo, hi]`` is a range: each device / channel / cluster draws its own value uniformly from it, once,
from ``network.seed`` (so every process that reads the same config builds the same network). Per-round
randomness (fading, interference, availability) lives in :mod:`collapipe_flwr.system.state`.
Units: Hz, W, J, bytes, dB for gains, dBm/Hz for the noise PSD. See docs/system_model.md.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.units import db_to_linear, dbm_to_watt


class Fading(StrEnum):
    """``network.uplink.fading`` / ``network.d2d.fading``: |g|^2 ~ Exp(1) each round (Rayleigh), or 1."""

    RAYLEIGH = "rayleigh"
    NONE = "none"


FADING_MODELS = tuple(Fading)

_SECTIONS: dict[str, tuple[str, ...]] = {
    "uplink": ("mean_gain_db", "fading", "interference_w", "power_max_w", "energy_max_j"),
    "d2d": ("bandwidth_hz", "gain_db", "interference_w", "fading", "latency_s"),
    "device": (
        "f_hz",
        "flops_per_cycle",
        "memory_bytes",
        "memory_share",
        "runtime_bytes",
        "d2d_power_w",
        "d2d_power_max_w",
        "energy_max_j",
        "availability",
        "effective_capacitance",
        "per_microbatch_s",
    ),
    "cu": ("memory_bytes",),
}
_TOP = (
    "name",
    "seed",
    "num_channels",
    "devices_per_cluster",
    "channel_bandwidth_hz",
    "noise_psd_dbm_per_hz",
    *_SECTIONS,
)


@dataclass(frozen=True)
class NetworkSpec:
    """Everything static about the edge network (symbols of Tables I-II).

    devices[n][k]: DeviceProfile of device k of cluster n (f_k, phi_k, gamma_k^max, p_k).
    channel_bandwidth_hz[j]: B_j, the uplink bandwidth of channel j (B_n^U of the CU matched to j).
    uplink_mean_gain_db[n]: mean power gain h_n of CU n's uplink (dB); fading multiplies it each round.
    uplink_interference_w: (lo, hi) of I_i, the per-channel, per-round interference at the BS (W).
    d2d_*: B^dd, h_dd (dB), I_dd (W) of the intra-cluster links; device_power_max_w = P_k^max.
    cu_power_max_w = P_n^max (C6), cu_energy_max_j = E_n^max (C8), device_energy_max_j = E_k^max (C9).
    availability: (lo, hi) of the per-round fraction of f_k a device gives to training, f_k(t).
    effective_capacitance: kappa of the CMOS energy model kappa * cycles * f^2 (eq. 16).
    per_microbatch_s: c0, the fixed time one stage spends per micro-batch besides its FLOPs (launch and
    hand-off of one chunk, measured by benchmarks/microbatch_cost.py); added to every chunk of eq. (15).
    """

    name: str
    num_channels: int
    devices: tuple[tuple[DeviceProfile, ...], ...]
    channel_bandwidth_hz: tuple[float, ...]
    noise_psd_w_hz: float
    uplink_mean_gain_db: tuple[float, ...]
    uplink_fading: Fading
    uplink_interference_w: tuple[float, float]
    cu_power_max_w: float
    cu_energy_max_j: float
    d2d_bandwidth_hz: float
    d2d_gain_db: float
    d2d_interference_w: float
    d2d_fading: Fading
    device_power_max_w: float
    device_energy_max_j: float
    availability: tuple[float, float]
    effective_capacitance: float
    cu_memory_bytes: float = 3e9
    d2d_latency_s: float = 0.0
    per_microbatch_s: float = 0.0
    # memory_share[n][k]: gamma_k^max as a share of the whole encoder's C7 memory (``device.memory_share``);
    # () = the device memories are absolute (``device.memory_bytes``). A spec with shares is sized to the model
    # by :meth:`sized_to` before anything plans with it.
    memory_share: tuple[tuple[float, ...], ...] = ()
    # gamma_rt: memory a device's runtime uses while it trains besides C7's tensors (the framework's working memory:
    # allocator caches, autograd, kernel scratch, hand-off buffers); not in the paper, measured (docs/system_model.md)
    # C7 reads gamma_rt + delta_k gamma_0 <= gamma_k^max; a memory_share preset sizes gamma_k^max on top of it.
    device_runtime_bytes: float = 0.0
    # the conf/network mapping this spec was drawn from (to_raw): the same mapping draws the same network
    source: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_raw(self) -> dict[str, Any]:
        return dict(self.source)

    @property
    def needs_sizing(self) -> bool:
        """Whether gamma_k^max is still a share of the model's memory (:meth:`sized_to` not applied yet)."""
        return bool(self.memory_share)

    def sized_to(self, encoder_memory_bytes: float) -> NetworkSpec:
        """This network with every gamma_k^max = gamma_rt + memory_share_k x ``encoder_memory_bytes`` (C7's memory of
        the whole encoder, L gamma_0, for the model actually trained: ``Workload.encoder_memory_bytes``), so a share
        below 1 is a device that cannot hold the encoder alone. A spec with absolute memories is returned as is."""
        if not self.memory_share:
            return self
        if not encoder_memory_bytes > 0 or not np.isfinite(encoder_memory_bytes):
            raise ConfigError(f"cannot size the network to an encoder of {encoder_memory_bytes!r} bytes; need > 0")
        devices = tuple(
            tuple(
                dataclasses.replace(d, memory_bytes=float(self.device_runtime_bytes + share * encoder_memory_bytes))
                for d, share in zip(cluster, shares)
            )
            for cluster, shares in zip(self.devices, self.memory_share)
        )
        return dataclasses.replace(self, devices=devices, memory_share=())

    @property
    def num_clusters(self) -> int:
        """N."""
        return len(self.devices)

    @property
    def devices_per_cluster(self) -> int:
        """K (the largest cluster's size)."""
        return max(len(d) for d in self.devices)

    def devices_of(self, n: int) -> list[DeviceProfile]:
        """The K device profiles of cluster n."""
        if not 0 <= n < self.num_clusters:
            raise ConfigError(f"cluster {n} does not exist; the network has clusters 0..{self.num_clusters - 1}")
        return list(self.devices[n])

    @property
    def uplink_mean_gain(self) -> np.ndarray:
        """Linear mean uplink power gains, shape [N]."""
        return db_to_linear(self.uplink_mean_gain_db)

    @property
    def d2d_gain(self) -> float:
        return float(db_to_linear(self.d2d_gain_db))

    @classmethod
    def from_config(cls, network: Mapping[str, Any], num_clusters: int) -> NetworkSpec:
        """Build the spec from a ``conf/network/*.yaml`` mapping; a bad key is a one-line ConfigError."""
        _check_layout(network, num_clusters)
        seed = _integer(network, "seed", "network.seed", minimum=0, default=0)
        rng = np.random.default_rng(seed)
        J = _integer(network, "num_channels", "network.num_channels", minimum=1)
        K = _integer(network, "devices_per_cluster", "network.devices_per_cluster", minimum=1)
        up, dd, dev, cu = (network[s] for s in ("uplink", "d2d", "device", "cu"))

        bandwidth = _draw(rng, network, "channel_bandwidth_hz", "network.channel_bandwidth_hz", J, positive=True)
        mean_gain_db = _draw(rng, up, "mean_gain_db", "network.uplink.mean_gain_db", num_clusters)
        devices, p_k_max, memory_share = _draw_devices(rng, dev, num_clusters, K)
        availability, interference = _checked_ranges(dev, up)
        return cls(
            name=str(network.get("name", "custom")),
            num_channels=J,
            devices=devices,
            channel_bandwidth_hz=tuple(float(x) for x in bandwidth),
            noise_psd_w_hz=float(dbm_to_watt(_number(network, "noise_psd_dbm_per_hz", "network.noise_psd_dbm_per_hz"))),
            uplink_mean_gain_db=tuple(float(x) for x in mean_gain_db),
            uplink_fading=choice("network.uplink.fading", up.get("fading"), Fading),
            uplink_interference_w=interference,
            cu_power_max_w=_number(up, "power_max_w", "network.uplink.power_max_w", positive=True),
            cu_energy_max_j=_number(up, "energy_max_j", "network.uplink.energy_max_j", positive=True),
            d2d_bandwidth_hz=_number(dd, "bandwidth_hz", "network.d2d.bandwidth_hz", positive=True),
            d2d_gain_db=_number(dd, "gain_db", "network.d2d.gain_db"),
            d2d_interference_w=_number(dd, "interference_w", "network.d2d.interference_w", nonneg=True),
            d2d_fading=choice("network.d2d.fading", dd.get("fading"), Fading),
            device_power_max_w=p_k_max,
            device_energy_max_j=_number(dev, "energy_max_j", "network.device.energy_max_j", positive=True),
            availability=availability,
            effective_capacitance=_number(
                dev, "effective_capacitance", "network.device.effective_capacitance", positive=True
            ),
            cu_memory_bytes=_number(cu, "memory_bytes", "network.cu.memory_bytes", positive=True),
            d2d_latency_s=_number(dd, "latency_s", "network.d2d.latency_s", nonneg=True) if "latency_s" in dd else 0.0,
            per_microbatch_s=(
                _number(dev, "per_microbatch_s", "network.device.per_microbatch_s", nonneg=True)
                if "per_microbatch_s" in dev
                else 0.0
            ),
            memory_share=memory_share,
            device_runtime_bytes=(
                _number(dev, "runtime_bytes", "network.device.runtime_bytes", nonneg=True)
                if "runtime_bytes" in dev
                else 0.0
            ),
            source=copy.deepcopy(dict(network)),
        )


# ----------------------------------------------------------------------------- config helpers
def _check_layout(network: Mapping[str, Any], num_clusters: int) -> None:
    """The mapping, its sections and their keys, and N: a one-line ConfigError for the first bad one."""
    if not isinstance(network, Mapping):
        raise ConfigError("network config must be a mapping; pick network=<preset> (see conf/network/)")
    _check_keys("network", network, _TOP)
    for section, keys in _SECTIONS.items():
        if not isinstance(network.get(section), Mapping):
            raise ConfigError(
                f"network.{section} is missing or not a mapping; copy it from conf/network/paper_table2.yaml"
            )
        _check_keys(f"network.{section}", network[section], keys)
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
        raise ConfigError(f"federation.num_clusters={num_clusters!r} must be an integer >= 1")


def _draw_devices(
    rng: np.random.Generator, dev: Mapping, num_clusters: int, K: int
) -> tuple[tuple[tuple[DeviceProfile, ...], ...], float, tuple[tuple[float, ...], ...]]:
    """devices[n][k] (f_k, phi_k, gamma_k^max, p_k drawn in that order), P_k^max with p_k <= P_k^max, and the
    memory shares when gamma_k^max is given as ``memory_share`` (drawn in gamma_k^max's place, so the other draws
    are the same as with a memory_bytes range; the profiles then hold the share until :meth:`NetworkSpec.sized_to`)."""
    f_hz = _draw(rng, dev, "f_hz", "network.device.f_hz", num_clusters * K, positive=True)
    phi = _draw(rng, dev, "flops_per_cycle", "network.device.flops_per_cycle", num_clusters * K, positive=True)
    by_share = _memory_by_share(dev)
    if by_share:
        memory = _draw(rng, dev, "memory_share", "network.device.memory_share", num_clusters * K, positive=True)
    else:
        memory = _draw(rng, dev, "memory_bytes", "network.device.memory_bytes", num_clusters * K, positive=True)
    p_k = _draw(rng, dev, "d2d_power_w", "network.device.d2d_power_w", num_clusters * K, positive=True)
    p_k_max = _number(dev, "d2d_power_max_w", "network.device.d2d_power_max_w", positive=True)
    if p_k.max() > p_k_max:
        raise ConfigError(
            f"network.device.d2d_power_w reaches {p_k.max():.4g} W above d2d_power_max_w={p_k_max:.4g} W "
            "(P_k^max); lower it"
        )
    clusters = [range(n * K, (n + 1) * K) for n in range(num_clusters)]
    devices = tuple(
        tuple(DeviceProfile(float(f_hz[i]), float(phi[i]), float(memory[i]), float(p_k[i])) for i in ids)
        for ids in clusters
    )
    shares = tuple(tuple(float(memory[i]) for i in ids) for ids in clusters) if by_share else ()
    return devices, p_k_max, shares


def _memory_by_share(dev: Mapping) -> bool:
    """Whether gamma_k^max comes as ``memory_share`` (of the model's encoder memory) or ``memory_bytes``: exactly
    one of the two."""
    has_bytes, has_share = "memory_bytes" in dev, "memory_share" in dev
    if has_bytes == has_share:
        raise ConfigError(
            "network.device needs exactly one of memory_bytes (gamma_k^max in bytes) and memory_share (gamma_k^max as "
            f"a share of the model's encoder memory); it has {'both' if has_bytes else 'neither'}"
        )
    return has_share


def _checked_ranges(dev: Mapping, up: Mapping) -> tuple[tuple[float, float], tuple[float, float]]:
    """(availability (lo, hi) with 0 < lo <= hi <= 1, uplink interference I (lo, hi) with lo >= 0 W)."""
    availability = _range(dev, "availability", "network.device.availability")
    if not 0 < availability[0] <= availability[1] <= 1:
        raise ConfigError(f"network.device.availability={list(availability)} must satisfy 0 < lo <= hi <= 1")
    interference = _range(up, "interference_w", "network.uplink.interference_w")
    if interference[0] < 0:
        raise ConfigError("network.uplink.interference_w must be >= 0 W")
    return availability, interference


def _check_keys(where: str, mapping: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]}; valid keys are {', '.join(sorted(allowed))}")


def _as_float(value: Any, key: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r} must be a number (write exponents as 1.0e-28)") from None


def _number(mapping: Mapping, name: str, key: str, positive: bool = False, nonneg: bool = False) -> float:
    if name not in mapping:
        raise ConfigError(f"{key} is missing; add it to the network preset (see conf/network/paper_table2.yaml)")
    value = mapping[name]
    if isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r} must be a single number, not a range")
    x = _as_float(value, key)
    if not np.isfinite(x) or (positive and not x > 0) or (nonneg and not x >= 0):
        raise ConfigError(f"{key}={value!r} must be {'> 0' if positive else '>= 0' if nonneg else 'finite'}")
    return x


def _range(mapping: Mapping, name: str, key: str) -> tuple[float, float]:
    """A ``[lo, hi]`` pair (or one number, read as lo = hi)."""
    if name not in mapping:
        raise ConfigError(f"{key} is missing; add it to the network preset (see conf/network/paper_table2.yaml)")
    value = mapping[name]
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigError(f"{key}={list(value)!r} must be a number or a [lo, hi] range")
        lo, hi = (_as_float(v, key) for v in value)
    else:
        lo = hi = _as_float(value, key)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ConfigError(f"{key}={value!r} must be a finite range with lo <= hi")
    return float(lo), float(hi)


def _draw(
    rng: np.random.Generator, mapping: Mapping, name: str, key: str, count: int, positive: bool = False
) -> np.ndarray:
    lo, hi = _range(mapping, name, key)
    if positive and not lo > 0:
        raise ConfigError(f"{key}={mapping[name]!r} must be > 0")
    return rng.uniform(lo, hi, size=count) if hi > lo else np.full(count, lo)


def _integer(mapping: Mapping, name: str, key: str, minimum: int, default: int | None = None) -> int:
    if name not in mapping:
        if default is not None:
            return default
        raise ConfigError(f"{key} is missing; add it to the network preset (see conf/network/paper_table2.yaml)")
    value = mapping[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}")
    return value
