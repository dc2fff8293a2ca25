"""CU transmit power (Sub-2's power step, eq. 42) for every candidate (CU n, channel j) pair at once.

For a pair with SINR slope g = h_{n,j} / (I_j + B_j N_0) and uplink size D bits, minimise

    V * D ln2 / (B_j ln(1 + g p))  +  w_gamma / (p h_{n,j} + I_j)  +  w_lin * p
    s.t.  0 <= p <= P_n^max (C6),   p * D ln2 / (B_j ln(1 + g p)) <= E_n^max (C8')

The paper reaches this with Dinkelbach's transform of the delay ratio and SCA on C8' (eq. 43). Here
neither approximation is needed: 1/ln(1+gp) is convex (the reciprocal of a positive concave function),
1/(ph+I) is convex, and C8' is equivalent to the convex constraint (D ln2 / (B E^max)) p <= ln(1 + g p).
So CVXPY solves the exact convex program, all pairs in one parametrised (DPP) problem that is compiled
once per pair count; a vectorised golden-section search on the same convex 1-D objective runs alongside
(and alone above CVXPY_MAX_PAIRS pairs, where CVXPY's canonicalisation costs seconds) and the better
point per pair is kept. w_gamma = Y_n * scale * C carries the drift of Gamma (eq. 28); w_lin = Y_n is the
paper's literal P2 drift term Y_n p_n.
"""

from __future__ import annotations

import warnings

import cvxpy as cp
import numpy as np

LN2 = float(np.log(2.0))
_PROBLEMS: dict[int, tuple] = {}
CVXPY_MAX_PAIRS = 256  # above this, the vectorised golden-section search alone (same convex problem)


def _problem(P: int):
    if P not in _PROBLEMS:
        p = cp.Variable(P, nonneg=True)
        w = cp.Variable(P)
        u = cp.Variable(P)
        slope = cp.Parameter(P, nonneg=True)  # g
        gain = cp.Parameter(P, nonneg=True)  # h
        interf = cp.Parameter(P, pos=True)  # I (plus the noise floor)
        a_gamma = cp.Parameter(P, nonneg=True)  # w_gamma / A
        a_lin = cp.Parameter(P, nonneg=True)  # w_lin / A
        energy = cp.Parameter(P, nonneg=True)  # D ln2 / (B E^max)
        pmax = cp.Parameter(P, nonneg=True)
        rate = cp.log(1 + cp.multiply(slope, p))
        objective = cp.sum(w + cp.multiply(a_gamma, u) + cp.multiply(a_lin, p))
        constraints = [
            w >= cp.inv_pos(rate),
            u >= cp.inv_pos(cp.multiply(gain, p) + interf),
            p <= pmax,
            cp.multiply(energy, p) <= rate,
        ]
        _PROBLEMS[P] = (
            cp.Problem(cp.Minimize(objective), constraints),
            p,
            (slope, gain, interf, a_gamma, a_lin, energy, pmax),
        )
    return _PROBLEMS[P]


def max_energy_power(slope, energy, pmax) -> np.ndarray:
    """Largest p in [0, pmax] with energy * p <= ln(1 + slope p) (C8'), by bisection (vectorised).

    Only the pairs where pmax breaks C8' bisect, each until lo and hi are adjacent floats (every later step
    would leave them as they are) or for 80 steps. Where energy >= slope (1 + 1e-9) no p > 0 meets C8'
    (ln(1 + g p) < g p), so the answer is 0 without bisecting (the margin is far above log1p's rounding)."""
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (slope, energy, pmax)))
    slope, energy, pmax = (a.ravel() for a in arrays)
    out = pmax.copy()
    bisect = ~(energy * pmax <= np.log1p(slope * pmax))
    out[bisect & (energy >= slope * (1 + 1e-9))] = 0.0
    idx = np.nonzero(bisect & (energy < slope * (1 + 1e-9)))[0]
    slope, energy = slope[idx], energy[idx]
    lo, hi = np.zeros(idx.size), pmax[idx]
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        moving = (mid != lo) & (mid != hi)
        if not moving.all():  # settled: lo, hi adjacent floats
            out[idx[~moving]] = lo[~moving]
            idx, slope, energy, lo, hi, mid = (a[moving] for a in (idx, slope, energy, lo, hi, mid))
        ok = energy * mid <= np.log1p(slope * mid)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    out[idx] = lo
    return out.reshape(arrays[0].shape)


def uplink_objective(p, V, bits, bandwidth, slope, gain, interference, w_gamma, w_lin):
    """The per-pair objective above, evaluated directly (used by callers and tests).

    Over eight parameters: one per symbol of eq. (42)'s objective (p, V, D, B, g, h, I, w_gamma, w_lin), broadcast.
    The objective V D ln2 / (B ln(1 + g p)) + w_gamma / (p h + I) + w_lin p written out, each parameter an array
    over the (CU n, channel j) pairs broadcast together; a grouping object would only be unpacked again here."""
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore"):
        delay = bits * LN2 / (bandwidth * np.log1p(slope * p))
    return V * delay + w_gamma / (p * gain + interference) + w_lin * p


def feasible_pairs(slope, energy) -> np.ndarray:
    """C8' can hold for some p > 0 iff energy < slope (the limit of ln(1+gp)/p at p -> 0)."""
    return np.asarray(energy) < np.asarray(slope) * (1 - 1e-9)


def optimal_power(V, bits, bandwidth, slope, gain, interference, w_gamma, w_lin, energy_max, pmax) -> np.ndarray:
    """Optimal p per pair (NaN where C8' cannot hold); all inputs broadcast to one shape [P].

    Over eight parameters: one per symbol of eq. (42) with C6 and C8' (V, D, B, g, h, I, w_gamma, w_lin, E^max, P^max).
    Each is an array over the (CU n, channel j) pairs, broadcast together into one vectorised solve (module
    docstring); a grouping object would only be unpacked again here."""
    arrays = np.broadcast_arrays(
        *(
            np.asarray(x, dtype=float)
            for x in (V, bits, bandwidth, slope, gain, interference, w_gamma, w_lin, energy_max, pmax)
        )
    )
    V, bits, bandwidth, slope, gain, interference, w_gamma, w_lin, energy_max, pmax = (a.ravel() for a in arrays)
    energy = bits * LN2 / (bandwidth * energy_max)
    ok = feasible_pairs(slope, energy)
    out = np.full(V.shape, np.nan)
    if not ok.any():
        return out.reshape(arrays[0].shape)
    idx = np.nonzero(ok)[0]
    A = V[idx] * bits[idx] * LN2 / bandwidth[idx]
    p_cap = max_energy_power(slope[idx], energy[idx], pmax[idx])
    if np.all(w_gamma[idx] == 0) and np.all(w_lin[idx] == 0):
        out[idx] = p_cap  # pure delay: the largest feasible power
        return out.reshape(arrays[0].shape)

    def objective(q: np.ndarray) -> np.ndarray:
        return uplink_objective(
            q, V[idx], bits[idx], bandwidth[idx], slope[idx], gain[idx], interference[idx], w_gamma[idx], w_lin[idx]
        )

    p = _golden_section(objective, p_cap)
    if len(idx) <= CVXPY_MAX_PAIRS:
        prob, p_var, params = _problem(len(idx))
        values = (slope[idx], gain[idx], interference[idx], w_gamma[idx] / A, w_lin[idx] / A, energy[idx], p_cap)
        for param, value in zip(params, values):
            param.value = np.maximum(value, 1e-300) if param is params[2] else np.maximum(value, 0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prob.solve(solver=cp.CLARABEL)
            if prob.status in ("optimal", "optimal_inaccurate") and p_var.value is not None:
                p_cvx = np.clip(np.asarray(p_var.value, dtype=float), 0, p_cap)
                better = np.isfinite(objective(p_cvx)) & (objective(p_cvx) < objective(p))
                p = np.where(better, p_cvx, p)
        except cp.error.SolverError:
            pass
    out[idx] = p
    return out.reshape(arrays[0].shape)


def _golden_section(f, hi: np.ndarray, iters: int = 100) -> np.ndarray:
    """Minimise a convex f on (0, hi] per element (fallback if the conic solver fails)."""
    lo = hi * 1e-12
    r = (np.sqrt(5) - 1) / 2
    a, b = lo, hi.copy()
    for _ in range(iters):
        c, d = b - r * (b - a), a + r * (b - a)
        left = f(c) < f(d)
        b = np.where(left, d, b)
        a = np.where(left, a, c)
    return 0.5 * (a + b)
