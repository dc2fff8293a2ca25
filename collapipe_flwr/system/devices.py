"""Static profile of one device k of a cluster (paper Table I / II)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from collapipe_flwr.errors import ConfigError


@dataclass(frozen=True)
class DeviceProfile:
    """What the optimizer and the runtime know about device k.

    f_hz: f_k, clock rate available to training (cycles/s); the per-round availability f_k(t) scales it.
    flops_per_cycle: phi_k, FLOPs per clock cycle.
    memory_bytes: gamma_k^max, memory budget for training a segment (constraint C7).
    d2d_power_w: p_k, D2D transmit power (W), used in eqs. (13)-(14).
    """

    f_hz: float
    flops_per_cycle: float
    memory_bytes: float
    d2d_power_w: float

    def __post_init__(self) -> None:
        for name in ("f_hz", "flops_per_cycle", "memory_bytes", "d2d_power_w"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(
                    f"device profile {name}={value!r} must be > 0; fix the device profile in the network preset"
                )

    @property
    def flops_per_second(self) -> float:
        """phi_k * f_k: peak training throughput in FLOP/s."""
        return self.f_hz * self.flops_per_cycle

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DeviceProfile:
        return cls(**{k: float(data[k]) for k in ("f_hz", "flops_per_cycle", "memory_bytes", "d2d_power_w")})
