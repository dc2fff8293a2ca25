"""Sub-1's array kernels (paper eq. 37): the least stage time T*(m, S) and a partition delta that meets it.

A chunk of device k with delta_k blocks lasts delta_k c_k(m) + d_k(m) (eq. 15); cap_k(m) is its C7/C9' bound
on delta_k. For a bound T, device k has room u_k(T) = #{delta in 1..cap_k: delta c_k + d_k <= T}, and S
devices admit a partition of the L blocks with every chunk <= T iff the S roomiest all have u_k >= 1 and
their rooms sum to >= L (segments.py). With G_v(T) = #{k: u_k(T) >= v} the S largest rooms sum to
sum_v min(S, G_v(T)), so both tests count chunk times: with Q[v, j] the j-th smallest time of a chunk of v
blocks over the devices, T*(m, S) = max(Q[1, S], L-th smallest of {Q[v, j]: j <= S}). Every value is one of
the K L chunk times, so T* is exactly the least feasible chunk time. Pure numpy, batched over leading axes.
"""

from __future__ import annotations

import numpy as np


def chunk_times(compute: np.ndarray, d2d: np.ndarray, cap: np.ndarray, L: int) -> np.ndarray:
    """delta c_k + d_k for delta = 1..L, inf where delta > cap_k: [..., K] -> [..., K, L]."""
    deltas = np.arange(1, L + 1)
    cand = deltas * compute[..., None] + d2d[..., None]
    return np.where(deltas <= cap[..., None], cand, np.inf)


def min_stage_times(compute: np.ndarray, d2d: np.ndarray, cap: np.ndarray, L: int) -> np.ndarray:
    """T*(m, S): the least stage time of a partition on exactly S = 1..K devices (inf where none exists, and for
    S > L); compute, d2d, cap of shape [..., M, K] -> [..., M, K]."""
    K = compute.shape[-1]
    with np.errstate(invalid="ignore"):
        cand = chunk_times(compute, d2d, cap, L)
    cand = np.where(np.isnan(cand), np.inf, cand)
    by_level = np.sort(np.swapaxes(cand, -1, -2), axis=-1)  # Q[..., v, j]: [..., M, L, K]
    out = np.full(compute.shape, np.inf)
    for S in range(1, min(K, L) + 1):
        first = by_level[..., :, :S].reshape(*by_level.shape[:-2], L * S)
        enough = np.partition(first, L - 1, axis=-1)[..., L - 1]  # sum_v min(S, G_v) >= L
        out[..., S - 1] = np.maximum(by_level[..., 0, S - 1], enough)  # and G_1 >= S
    return out


def partitions(
    compute: np.ndarray, d2d: np.ndarray, cap: np.ndarray, L: int, S: np.ndarray, T: np.ndarray
) -> np.ndarray:
    """delta [N, K] on exactly S_n devices with every chunk <= T_n (T_n feasible for S_n, see min_stage_times):
    the S_n devices with the most room (ties: lower k) take their room, then the slowest stage that keeps
    >= 1 block gives one up until sum_k delta_k = L. compute, d2d, cap: [N, K]; S, T: [N]."""
    N, K = compute.shape
    top = max(L, int(np.max(cap, initial=0)))
    deltas = np.arange(1, top + 1)
    fits = (deltas <= cap[..., None]) & (deltas * compute[..., None] + d2d[..., None] <= T[:, None, None])
    room = fits.sum(axis=2)
    order = np.argsort(-room, axis=1, kind="stable")
    chosen = np.zeros((N, K), dtype=bool)
    np.put_along_axis(chosen, order, np.arange(K)[None, :] < np.asarray(S)[:, None], axis=1)
    delta = np.where(chosen, room, 0)
    excess = delta.sum(axis=1) - L
    rows = np.nonzero(excess > 0)[0]
    while rows.size:  # shave blocks off the slowest stage that keeps >= 1 block
        d = delta[rows]
        with np.errstate(invalid="ignore"):  # 0 blocks on a device that cannot compute: 0 * inf, masked out
            chunk = np.where(d > 1, d * compute[rows] + d2d[rows], -np.inf)
        delta[rows, np.argmax(chunk, axis=1)] -= 1
        excess[rows] -= 1
        rows = rows[excess[rows] > 0]
    return delta
