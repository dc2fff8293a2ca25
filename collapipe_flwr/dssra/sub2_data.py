"""What Sub-2 (power control + channel matching, Algorithm 3) reads and hands back within one round's BCD.

:class:`RadioState` is the round's radio, fixed across the BCD passes; :class:`Sub2Result` is one Sub-2
solve given the segments S_n of every cluster (dssra/policies.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RadioState", "Sub2Result"]


@dataclass(frozen=True)
class RadioState:
    """The uplink of round t for N CUs on J channels.

    gain [N, J]: h_{n,j}.  interf [J]: I_j (W), the interference on channel j without the noise floor.
    bandwidth [N, J]: B_n^U = B_j of the channel CU n would use.  slope [N, J]: h_{n,j} / (I_j + B N_0),
    the SINR per watt.  p_cap [N, J]: the largest power within C6 (p <= P^max) and C8'
    (p D / (B log2(1 + slope p)) <= E^max).
    """

    gain: np.ndarray
    interf: np.ndarray
    bandwidth: np.ndarray
    slope: np.ndarray
    p_cap: np.ndarray


@dataclass(frozen=True)
class Sub2Result:
    """One Sub-2 solve: the matching a_{n,j} and, for every (CU, channel) pair, what it would cost.

    channel [N]: j of CU n, None when it sits out.  power [N, J]: p_{n,j} (W) by Dinkelbach + SCA (NaN where
    C8' cannot hold).  uplink [N, J]: tau_{n,j}^Up = D ln2 / (B ln(1 + slope p)) seconds (inf where
    infeasible).  cost [N, J]: V (tau_n^pipe + tau_{n,j}^Up) + power drift (inf where infeasible).
    virtual [N]: the drift of CU n when it sits out.  left_out: {n: why CU n got no channel}.
    """

    channel: list[int | None]
    power: np.ndarray
    uplink: np.ndarray
    cost: np.ndarray
    virtual: np.ndarray
    left_out: dict[int, str]
