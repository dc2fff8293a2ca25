"""Privacy accounting of ``privacy.mode`` (docs/privacy.md "Accounting"): the (epsilon, delta) a run spends, per
round and in total, for the mechanism it actually runs. Pure functions of numbers; the server's
:class:`~collapipe_flwr.fl.server.privacy_ledger.PrivacyLedger` keeps the counts and writes the records.

The accountant is Opacus' :class:`opacus.accountants.RDPAccountant` (Renyi DP, Mironov 2017; Mironov, Talwar,
Zhang 2019 for subsampling), kept as its history of (noise multiplier z, sampling rate q, steps). For q = 1 its
RDP of the Gaussian mechanism with noise multiplier z at order alpha is

    RDP(alpha) = alpha / (2 z^2)            per step; T steps compose by summing: T alpha / (2 z^2),

and Opacus converts RDP to (epsilon, delta) with Balle et al. 2020 (Theorem 21, arXiv 1905.09982):

    epsilon = min_alpha [ RDP(alpha) - (ln delta + ln alpha) / (alpha - 1) + ln((alpha - 1) / alpha) ],

which is never larger than the classic conversion min_alpha [ RDP(alpha) + ln(1/delta) / (alpha - 1) ]
(Mironov 2017, Prop. 3), over the alpha grid :data:`ALPHAS` (Opacus' default orders, extended to 1024).

The two mechanisms:

- **central** (``privacy.mode: central``; user-level DP over clusters, add/remove-one-cluster adjacency): each CU's
  update is clipped to L2 norm C, the server adds N(0, (z C)^2) to the sum of the round's n updates (sigma = z C / n
  on their mean, fl/server/aggregation/central_dp.py): a Gaussian mechanism with noise multiplier z per round
  (DP-FedAvg, McMahan et al. 2018). **Sampling: q = 1.** DSSRA (and every baseline but ``random``) selects the
  clusters deterministically from the channel gains, the queues Y_n (which depend on earlier selections) and for
  ``loss_only`` the reported losses; the selection is neither a uniform nor an independent (Poisson) sample, and it
  is written to rounds.jsonl. Amplification by subsampling (q = |selected| / N) would need a secret random sample
  independent of the data, so it is not claimed: every round that aggregated at least one update is a full step of
  the mechanism for every cluster (worst case: each cluster in every round).
- **local** (``privacy.mode: local``; Flower's ``LocalDpMod``): each CU clips its update to C and adds
  N(0, sigma^2) with sigma = C sqrt(2 ln(1.25/delta)) / epsilon before the upload, Flower taking the sensitivity
  as C. Each release is claimed (epsilon, delta)-DP by the classic Gaussian calibration (Dwork and Roth 2014,
  Theorem A.1, which proves it for epsilon < 1). Over k releases of one CU this reports both basic composition
  (k epsilon, k delta) and the accountant's RDP composition of the Gaussian mechanism with noise multiplier
  sigma / C = sqrt(2 ln(1.25/delta)) / epsilon, q = 1, k steps, at the same delta (valid for any epsilon). The
  run's total is the CU with the most releases (a selected CU counts as releasing).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

ACCOUNTANT = "opacus.RDPAccountant"
# Opacus' RDPAccountant.DEFAULT_ALPHAS (1.1 .. 10.9 by 0.1, 12 .. 63), then larger orders for small epsilons
ALPHAS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 384, 512, 768, 1024]
)
CENTRAL_SAMPLE_RATE = 1.0  # see the module docstring: cluster selection is not a random sample


def local_noise_multiplier(epsilon: float, delta: float) -> float:
    """z = sigma / C = sqrt(2 ln(1.25 / delta)) / epsilon: LocalDpMod's noise in units of its sensitivity C."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def gaussian_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """epsilon at ``delta`` of ``steps`` compositions of the (subsampled) Gaussian mechanism, from Opacus'
    RDPAccountant over :data:`ALPHAS` (0 for no step; inf for z = 0, no noise)."""
    if steps <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from opacus.accountants import RDPAccountant  # imported when used: Opacus takes seconds to import

    accountant = RDPAccountant()
    accountant.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    with warnings.catch_warnings():  # "optimal order is the largest alpha": the grid's edge, reported as is
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta=delta, alphas=list(ALPHAS)))


def basic_composition(epsilon: float, delta: float, releases: int) -> tuple[float, float]:
    """k releases of an (epsilon, delta)-DP mechanism: (k epsilon, k delta) (Dwork and Roth 2014, Theorem 3.16)."""
    return releases * epsilon, releases * delta


def central_entry(noise_multiplier: float, steps: int, charged: bool, delta: float) -> dict[str, Any]:
    """The ``privacy`` section of a central-DP round after ``steps`` noised rounds in all, this round one of them
    when ``charged``: epsilon_round (one step of the mechanism alone, 0 if not charged) and epsilon_total."""
    one = gaussian_epsilon(noise_multiplier, CENTRAL_SAMPLE_RATE, 1, delta)
    return {
        "mode": "central",
        "epsilon_round": one if charged else 0.0,
        "epsilon_total": gaussian_epsilon(noise_multiplier, CENTRAL_SAMPLE_RATE, steps, delta),
        "delta": delta,
        "accountant": ACCOUNTANT,
        "noise_multiplier": noise_multiplier,
        "sample_rate": CENTRAL_SAMPLE_RATE,
        "steps": steps,
    }


def local_entry(epsilon: float, delta: float, releases: Mapping[int, int], charged: bool) -> dict[str, Any]:
    """The ``privacy`` section of a local-DP round, ``releases`` = uploads so far per cluster: epsilon_round (one
    release's epsilon if ``charged``, else 0), epsilon_total (the accountant's RDP composition for the CU with the
    most releases) and the basic composition beside it."""
    most = max(releases.values(), default=0)
    z = local_noise_multiplier(epsilon, delta)
    eps_basic, delta_basic = basic_composition(epsilon, delta, most)
    return {
        "mode": "local",
        "epsilon_round": epsilon if charged else 0.0,
        "epsilon_total": gaussian_epsilon(z, 1.0, most, delta),
        "delta": delta,
        "accountant": ACCOUNTANT,
        "noise_multiplier": z,
        "sample_rate": 1.0,
        "releases": {str(n): k for n, k in sorted(releases.items())},
        "epsilon_total_basic": eps_basic,
        "delta_total_basic": delta_basic,
    }
