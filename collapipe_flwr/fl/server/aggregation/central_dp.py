"""Central DP's server half (``privacy.mode: central``): Gaussian noise on the round's aggregate.

The CUs clip their updates to L2 norm C (Flower's ``fixedclipping_mod``); the server adds noise with
sigma = z C / n (Flower's ``compute_stdv``; n = the updates aggregated this round) to every floating-point
parameter of the new global model, as Flower's ``DifferentialPrivacyClientSideFixedClipping`` does to the arrays
its inner strategy returns. The noise is drawn from a generator seeded by (run seed, round t), so a run with the
same seed draws the same noise. The (epsilon, delta) this spends is accounted in config/privacy_accounting.py
(a Gaussian mechanism with noise multiplier z per round, q = 1: CU selection is not a random sample).
"""

from __future__ import annotations

import torch

from collapipe_flwr.config import PrivacySpec
from collapipe_flwr.flower_internals import compute_stdv


def noise_sigma(privacy: PrivacySpec, num_updates: int) -> float:
    """sigma = z C / n of the round's aggregate (0 when no update came back)."""
    return compute_stdv(privacy.noise_multiplier, privacy.clipping_norm, num_updates) if num_updates else 0.0


def add_central_noise(
    state: dict[str, torch.Tensor], privacy: PrivacySpec, num_updates: int, seed: int, round_: int
) -> dict[str, torch.Tensor]:
    """``state`` (a flat state dict) with N(0, sigma^2) added to every floating-point tensor (new tensors)."""
    sigma = noise_sigma(privacy, num_updates)
    if sigma <= 0:
        return state
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(round_))
    out = {}
    for name, tensor in state.items():
        if tensor.is_floating_point():
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * sigma
            out[name] = (tensor.to(torch.float64) + noise).to(tensor.dtype)
        else:
            out[name] = tensor
    return out
