"""Per-round channel and device state (seeded, reproducible per round t).

``StateSampler(spec, seed).sample(t)`` draws, from ``numpy.random.default_rng([seed, t])``:
* h_{n,j}(t): uplink power gain of CU n on channel j = mean gain (Table II, dB) x |g|^2, with
  |g|^2 ~ Exp(1) under Rayleigh fading (1 without fading);
* I_j(t): interference at the BS on channel j, uniform in the preset's range (W);
* h_dd,n,k(t): D2D power gain of device k's link (mean h_dd x Rayleigh draw, or h_dd);
* f_k(t)/f_k: the fraction of device k's clock available to training this round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapipe_flwr.system.network import Fading, NetworkSpec


@dataclass(frozen=True)
class RoundState:
    """The state the BS and the CUs see at the start of round t (lists so it serialises as JSON)."""

    round: int
    uplink_gain: tuple[tuple[float, ...], ...]  # [N][J], linear power gain h_{n,j}(t)
    uplink_interference_w: tuple[float, ...]  # [J], I_j(t) in W
    d2d_gain: tuple[tuple[float, ...], ...]  # [N][K], linear power gain of device k's D2D link
    availability: tuple[tuple[float, ...], ...]  # [N][K], f_k(t) / f_k in (0, 1]

    def gain_matrix(self) -> np.ndarray:
        return np.asarray(self.uplink_gain, dtype=float)

    def interference(self) -> np.ndarray:
        return np.asarray(self.uplink_interference_w, dtype=float)

    def to_dict(self) -> dict:
        return {
            "round": self.round,
            "uplink_gain": [list(r) for r in self.uplink_gain],
            "uplink_interference_w": list(self.uplink_interference_w),
            "d2d_gain": [list(r) for r in self.d2d_gain],
            "availability": [list(r) for r in self.availability],
        }

    @classmethod
    def from_dict(cls, d: dict) -> RoundState:
        return cls(
            round=int(d["round"]),
            uplink_gain=tuple(tuple(float(x) for x in r) for r in d["uplink_gain"]),
            uplink_interference_w=tuple(float(x) for x in d["uplink_interference_w"]),
            d2d_gain=tuple(tuple(float(x) for x in r) for r in d["d2d_gain"]),
            availability=tuple(tuple(float(x) for x in r) for r in d["availability"]),
        )


class StateSampler:
    """Seeded source of RoundStates: ``sample(t)`` is the same for the same (spec, seed, t)."""

    def __init__(self, spec: NetworkSpec, seed: int) -> None:
        self.spec = spec
        self.seed = int(seed)

    def sample(self, t: int) -> RoundState:
        spec = self.spec
        rng = np.random.default_rng([self.seed, int(t), 0x5EED])
        N, J, K = spec.num_clusters, spec.num_channels, spec.devices_per_cluster
        fading = rng.exponential(1.0, size=(N, J)) if spec.uplink_fading == Fading.RAYLEIGH else np.ones((N, J))
        gain = spec.uplink_mean_gain[:, None] * fading
        lo, hi = spec.uplink_interference_w
        interference = rng.uniform(lo, hi, size=J)
        dd_fading = rng.exponential(1.0, size=(N, K)) if spec.d2d_fading == Fading.RAYLEIGH else np.ones((N, K))
        d2d = spec.d2d_gain * dd_fading
        a_lo, a_hi = spec.availability
        availability = rng.uniform(a_lo, a_hi, size=(N, K))
        return RoundState(
            round=int(t),
            uplink_gain=tuple(tuple(float(x) for x in row) for row in gain),
            uplink_interference_w=tuple(float(x) for x in interference),
            d2d_gain=tuple(tuple(float(x) for x in row) for row in d2d),
            availability=tuple(tuple(float(x) for x in row) for row in availability),
        )
