"""Per-round convergence term Gamma (eq. 28) and the Lyapunov virtual queue (eq. 29)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.system.network import NetworkSpec


@dataclass(frozen=True)
class ConvergenceParams:
    """beta (smoothness, eq. 17), eta (learning rate), phi (gradient bound, eq. 18), C (eq. 25), N, L.

    Gamma_n = beta eta^2 / (2N) * (phi^2 / L * S_n^2 + C / (p_n h_n + I_i) + phi^2)   (eq. 28)
    """

    beta: float
    eta: float
    grad_bound: float
    interference_c: float
    gamma_max: float
    num_clusters: int
    num_blocks: int

    def __post_init__(self) -> None:
        for name in ("beta", "eta", "grad_bound", "gamma_max"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"scheduler.convergence.{name}={getattr(self, name)!r} must be > 0")
        if not self.interference_c >= 0:
            raise ConfigError(f"scheduler.convergence.interference_c={self.interference_c!r} must be >= 0")

    @property
    def scale(self) -> float:
        """beta eta^2 / (2N)."""
        return self.beta * self.eta**2 / (2.0 * self.num_clusters)

    def segment_term(self, S):
        """The part of Gamma that depends on S: scale * phi^2 S^2 / L."""
        return self.scale * self.grad_bound**2 * np.asarray(S, dtype=float) ** 2 / self.num_blocks

    def interference_term(self, power_w, gain, interference_w):
        """The part of Gamma that depends on p_n: scale * C / (p_n h_n + I_i) (eq. 25)."""
        return self.scale * self.interference_c / (np.asarray(power_w, dtype=float) * gain + interference_w)

    def constant_term(self) -> float:
        return self.scale * self.grad_bound**2

    def gamma(self, S, power_w, gain, interference_w):
        """Gamma of eq. (28)."""
        return self.segment_term(S) + self.interference_term(power_w, gain, interference_w) + self.constant_term()


def queue_update(Y, gamma, gamma_max):
    """Y_n(t+1) = max(Y_n(t) + Gamma_n^t - Gamma^max, 0) (eq. 29)."""
    return np.maximum(np.asarray(Y, dtype=float) + np.asarray(gamma, dtype=float) - gamma_max, 0.0)


def fair_share_gamma(params: ConvergenceParams, S: int, power_w: float, gain: float, interference_w: float, J: int):
    """Gamma of eq. (28) averaged over the N clusters when the J channels are shared out equally:
    (J'/N) Gamma(S, p, h, I) + (1 - J'/N) Gamma(S, 0, h, I), J' = min(J, N); an idle CU sends nothing (p = 0).

    The reading of Gamma^max used by conf/scheduler/*.yaml (docs/system_model.md): Gamma^max = 1.07 x this
    at S = 1, p = P_n^max and the mean channel, so a plan that pipelines over more devices (S > 1), a bad fade or
    a CU left out too often pushes Gamma_n above Gamma^max and its queue Y_n grows (C10 binds)."""
    share = min(J, params.num_clusters) / params.num_clusters
    sent = params.gamma(S, power_w, gain, interference_w)
    idle = params.gamma(S, 0.0, gain, interference_w)
    return float(share * sent + (1 - share) * idle)


GAMMA_MAX_MARGIN = 1.07  # the calibrated reading's slack over the fair-share Gamma (docs/system_model.md)


def calibrated_gamma_max(
    params: ConvergenceParams, power_max_w: float, gain: float, interference_w: float, J: int
) -> float:
    """Gamma^max by the reading conf/scheduler/*.yaml was calibrated with (docs/system_model.md "Calibrated
    Gamma^max"): 1.07 x :func:`fair_share_gamma` at S = 1, p = P_n^max, the mean channel gain h_n and the mean
    interference I_i, for ``params``' N and L and J channels. It depends on N (eq. 28's 1/(2N)), L (S^2/L) and J,
    so one value does not fit every setting: 3.5 at the default (N = 2, L = 3, J = 2), about 2.07 at the paper's
    N = 3, L = 6, J = 4."""
    return GAMMA_MAX_MARGIN * fair_share_gamma(params, 1, power_max_w, gain, interference_w, J)


def calibrated_gamma_max_for(params: ConvergenceParams, spec: NetworkSpec) -> float:
    """:func:`calibrated_gamma_max` in the network ``spec``'s setting (``scheduler.convergence.gamma_max: auto``):
    P_n^max, the mean over the CUs of their mean uplink gains (dB, as conf/network gives them), the middle of the
    interference range I_i and its J channels, with ``params``' N, L (their ``gamma_max`` is not read)."""
    gain = 10.0 ** (float(np.mean(spec.uplink_mean_gain_db)) / 10.0)
    interference = float(np.mean(spec.uplink_interference_w))
    return calibrated_gamma_max(params, spec.cu_power_max_w, gain, interference, spec.num_channels)
