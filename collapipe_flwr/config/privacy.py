"""The ``privacy`` section: differential privacy on what a CU uploads each round (its weights, eq. 11's
theta_enc and the embedding), with Flower's own mods and noise (docs/privacy.md).

- ``none``: the update travels as trained.
- ``local``: local DP: each CU clips its update (the difference to the weights it downloaded) to L2 norm C and
  adds Gaussian noise with sigma = C sqrt(2 ln(1.25 / delta)) / epsilon before it leaves (Flower's ``LocalDpMod``,
  with the sensitivity taken as C).
- ``central``: central DP with client-side clipping: each CU clips its update to C (Flower's
  ``fixedclipping_mod``), the server adds Gaussian noise with sigma = z C / n to the aggregate of the n updates
  of the round (Flower's ``compute_stdv``, as its ``DifferentialPrivacyClientSideFixedClipping`` wrapper does).

What a run spends, per round and in total, is accounted in config/privacy_accounting.py, and
``privacy.max_epsilon`` (> 0) refuses at start-up a run whose planned rounds would spend more.

Nothing here touches the per-step data plane (activations, labels, gradients): docs/privacy.md says what that
exchange reveals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from collapipe_flwr.config.privacy_accounting import CENTRAL_SAMPLE_RATE, gaussian_epsilon, local_noise_multiplier
from collapipe_flwr.spec_parsing import choices, require


class PrivacyMode(StrEnum):
    """``privacy.mode``: no DP, local DP (each CU noises its update) or central DP (the server noises the sum)."""

    NONE = "none"
    LOCAL = "local"
    CENTRAL = "central"


@dataclass(frozen=True)
class PrivacySpec:
    """mode: none | local | central; clipping_norm: C, the bound on the L2 norm of a CU's update (all parts it
    uploads); noise_multiplier: z of central DP; epsilon, delta: the Gaussian mechanism of local DP."""

    mode: PrivacyMode = PrivacyMode.NONE
    clipping_norm: float = 1.0
    noise_multiplier: float = 1.0
    epsilon: float = 1.0
    delta: float = 1e-5
    max_epsilon: float = 0.0

    def __post_init__(self) -> None:
        choices(self, "privacy", mode=PrivacyMode)
        for key, low, open_low in (("clipping_norm", 0.0, True), ("noise_multiplier", 0.0, False)):
            value = getattr(self, key)
            ok = _number(value) and (value > low if open_low else value >= low)
            require(ok, f"privacy.{key}={value!r} must be a finite number {'>' if open_low else '>='} {low:g}")
        require(
            _number(self.epsilon) and self.epsilon > 0,
            f"privacy.epsilon={self.epsilon!r} must be a finite number > 0",
        )
        require(_number(self.delta) and 0 < self.delta < 1, f"privacy.delta={self.delta!r} must be a number in (0, 1)")
        require(
            _number(self.max_epsilon) and self.max_epsilon >= 0,
            f"privacy.max_epsilon={self.max_epsilon!r} must be a finite number >= 0 (0: no limit)",
        )

    @property
    def enabled(self) -> bool:
        return self.mode is not PrivacyMode.NONE

    def planned_epsilon(self, rounds: int) -> float:
        """The total epsilon of ``rounds`` rounds in the worst case (every cluster selected, and charged, each round;
        config/privacy_accounting.py): the accountant's number that ``central_entry`` / ``local_entry`` report
        after the last round; 0 for ``none``."""
        match self.mode:
            case PrivacyMode.CENTRAL:
                return gaussian_epsilon(self.noise_multiplier, CENTRAL_SAMPLE_RATE, rounds, self.delta)
            case PrivacyMode.LOCAL:
                return gaussian_epsilon(local_noise_multiplier(self.epsilon, self.delta), 1.0, rounds, self.delta)
        return 0.0

    def local_sigma(self) -> float:
        """Local DP's noise standard deviation per parameter: C sqrt(2 ln(1.25 / delta)) / epsilon."""
        return self.clipping_norm * math.sqrt(2 * math.log(1.25 / self.delta)) / self.epsilon


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
