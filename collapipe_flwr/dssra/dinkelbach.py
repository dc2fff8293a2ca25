"""CU transmit power by Dinkelbach + SCA (paper Algorithm 3, eqs. 42-44), all (CU n, channel j) pairs at once.

Per pair, with SINR x = g p (g = h_{n,j} / (I_j + B_j N_0)), R(x) = ln(1 + x) and uplink size D bits, Sub-2's
power problem (eq. 42, divided by A = V D ln2 / B_j so that every pair has the same scale) is

    min_x  f(x) = 1 / R(x) + a_g / (I + I' x) + a_l x / g          (I' = I + B N_0, so h p + I = I + I' x)
    s.t.   x <= g P^max                                 (C6)
           (e / g) x <= R(x),  e = D ln2 / (B E^max)    (C8': p D / (B log2(1 + g p)) <= E^max)
           x >= g p_C11                                 (C11': Gamma_n(S_n, p) <= Gamma^max where reachable)

a_g = w_gamma / A carries the drift Y_n beta eta^2 C / (2N (p h + I)) of eq. (28); a_l = w_lin / A the
paper's literal Y_n p_n of eq. (32). The delay term is a ratio, so (Dinkelbach) f = N / R with
N(x) = 1 + a_g R(x) / (I + I' x) + a_l x R(x) / g, and for a given lambda the parametric (subtractive) problem

    F(lambda) = min_x  Phi(x) = N(x) - lambda R(x)
              = 1 + (a_l / g) (-entr(1 + x)) - (lambda + a_l / g) R(x) + a_g rho(x),   rho = R / (I + I' x)

whose root lambda* (F(lambda*) = 0) is the optimal value (x R(x) = -entr(1+x) - R(x) is convex). Only
rho is not convex (it is concave below x ~ e^1.5 - 1 and convex above). SCA replaces it around the current
point x_i by its first-order Taylor expansion plus a curvature term (c/2)(x - x_i)^2, c >= sup rho''
(bound below), so the surrogate is convex and lies above Phi, with equality and equal slope at x_i. One
CVXPY problem (vector variable over every pair, DPP with cp.Parameter, compiled once per pair count)
solves the surrogate; each solve decreases f (Phi(x_{i+1}) <= surrogate(x_{i+1}) <= surrogate(x_i) = 0, i.e.
f(x_{i+1}) <= lambda_i); lambda is updated to f(x_{i+1}) and the loop stops when F(lambda) ~ 0 for every
pair (relative decrease below ``tol``). A fixed point is a stationary point of f, which is convex in x
(1/ln(1+x), 1/(I + I'x) and x are convex), so it is the global optimum. The C8' and C11' constraints are
kept in their exact convex (resp. linear) form instead of the paper's tangent (43)-(44): those tangents are
relaxations of a concave/convex function and could admit powers that break C8.

Curvature bound: with u = 1 + x and eps = I' - I >= 0, rho = ln u / (I' u - eps) and
rho'' <= (2 k ln u - 3) / (I' u^3), k = (1 - eps / I')^-3; its maximum over u >= 1 is at
ln u = (2k + 9) / (6k): c = (2k / 3) exp(-(2k + 9) / (2k)) / I'.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from numpy.typing import ArrayLike

from collapipe_flwr.dssra.power import LN2, feasible_pairs, max_energy_power

_PROBLEMS: dict[int, _Surrogate] = {}
DPP_MAX_PAIRS = 256


@dataclass
class _Surrogate:
    """The convex SCA surrogate of Phi_lambda for P pairs, compiled once (DPP) and re-solved with new values."""

    problem: cp.Problem
    x: cp.Variable
    q_ent: cp.Parameter  # a_l / g          (weight of -entr(1 + x))
    mu: cp.Parameter  # lambda + a_l / g  (weight of -R(x))
    lin: cp.Parameter  # a_g (rho'(x_i) - c x_i)
    quad: cp.Parameter  # a_g c / 2
    eg: cp.Parameter  # e / g            (C8')
    x_max: cp.Parameter  # g P^max          (C6)
    x_min: cp.Parameter  # g p_C11          (C11')

    @classmethod
    def build(cls, P: int) -> _Surrogate:
        x = cp.Variable(P, nonneg=True)
        r = cp.Variable(P)
        q_ent, mu, quad, eg, x_max, x_min = (cp.Parameter(P, nonneg=True) for _ in range(6))
        lin = cp.Parameter(P)
        objective = (
            cp.sum(cp.multiply(q_ent, -cp.entr(1 + x)))
            - cp.sum(cp.multiply(mu, r))
            + cp.sum(cp.multiply(lin, x))
            + cp.sum(cp.multiply(quad, cp.square(x)))
        )
        constraints = [r <= cp.log(1 + x), cp.multiply(eg, x) <= r, x <= x_max, x >= x_min]
        return cls(cp.Problem(cp.Minimize(objective), constraints), x, q_ent, mu, lin, quad, eg, x_max, x_min)

    def solve(self, values: dict[str, np.ndarray], start: np.ndarray, dpp: bool = True) -> np.ndarray | None:
        for name, value in values.items():
            getattr(self, name).value = value
        self.x.value = start
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.problem.solve(solver=cp.CLARABEL, warm_start=True, ignore_dpp=not dpp)
        except cp.error.SolverError:
            return None
        if self.problem.status not in ("optimal", "optimal_inaccurate") or self.x.value is None:
            return None
        return np.asarray(self.x.value, dtype=float)


def _solve_surrogate(values: dict[str, np.ndarray], start: np.ndarray) -> np.ndarray | None:
    """Solve the surrogate for the P pairs in ``values``. Up to DPP_MAX_PAIRS pairs the problem is padded to
    a power-of-two size and its compiled DPP form is cached (only parameter values change between solves);
    above it CVXPY's parameter tensor is too costly to build (minutes for 5,000 pairs), so the problem is
    canonicalised afresh with the values as constants (a few ms)."""
    P = len(start)
    if P > DPP_MAX_PAIRS:
        out = _Surrogate.build(P).solve(values, start, dpp=False)
    else:
        size = max(8, 1 << (P - 1).bit_length())
        if size not in _PROBLEMS:
            _PROBLEMS[size] = _Surrogate.build(size)
        pad = size - P
        padded = {k: np.concatenate([v, np.full(pad, 1.0 if k == "mu" else 0.0)]) for k, v in values.items()}
        out = _PROBLEMS[size].solve(padded, np.concatenate([start, np.zeros(pad)]))
        out = None if out is None else out[:P]
    if out is None and P > 1:  # the pairs are independent: isolate an ill-conditioned one by halving
        half = P // 2
        parts = [
            _solve_surrogate({k: v[sl] for k, v in values.items()}, start[sl])
            for sl in (slice(0, half), slice(half, P))
        ]
        out = np.concatenate(
            [p if p is not None else start[sl] for p, sl in zip(parts, (slice(0, half), slice(half, P)))]
        )
    return out


def curvature_bound(interference, interference_noise) -> np.ndarray:
    """c >= sup_x rho''(x) for rho = ln(1+x) / (I + I' x) (see the module docstring)."""
    I, Ip = np.asarray(interference, dtype=float), np.asarray(interference_noise, dtype=float)
    k = (1.0 - (Ip - I) / Ip) ** -3
    return (2 * k / 3) * np.exp(-(2 * k + 9) / (2 * k)) / Ip


def _rho_prime(x, I, Ip):
    D = I + Ip * x
    return 1.0 / ((1 + x) * D) - np.log1p(x) * Ip / D**2


@dataclass(frozen=True)
class PowerProblem:
    """Sub-2's power problem (eq. 42 under C6, C8', C11') for a set of (CU n, channel j) pairs; every field
    broadcasts to one shape, one entry per pair.

    V: the Lyapunov weight.  bits: D, the uplink size.  bandwidth: B_j (Hz).  slope: g = h_{n,j} / (I_j + B N_0).
    gain: h_{n,j}.  interference: I_j (W) without the noise floor.  w_gamma: the weight of 1 / (p h + I)
    (Y_n's Gamma_n drift, eq. 28).  w_lin: the weight of p (the paper's Y_n p_n, eq. 32).  energy_max: E^max
    (J, C8').  pmax: P^max (W, C6).  p_floor: the C11' lower bound p_C11 (W).  p_cap: the largest power within
    C6 and C8', max_energy_power(slope, D ln2 / (B E^max), P^max), where the caller has it (None: computed).
    """

    V: ArrayLike
    bits: ArrayLike
    bandwidth: ArrayLike
    slope: ArrayLike
    gain: ArrayLike
    interference: ArrayLike
    w_gamma: ArrayLike
    w_lin: ArrayLike
    energy_max: ArrayLike
    pmax: ArrayLike
    p_floor: ArrayLike = 0.0
    p_cap: ArrayLike | None = None


@dataclass(frozen=True)
class PowerResult:
    """p per pair (NaN where C8' cannot hold), the number of CVXPY solves (Dinkelbach/SCA iterations) and,
    per iteration, the largest relative decrease of f over the pairs, -F(lambda) / (lambda R)."""

    power_w: np.ndarray
    iterations: int
    residuals: tuple[float, ...]


def c11_power_floor(budget, scale_c, gain, interference, p_cap) -> np.ndarray:
    """Smallest p with scale * C / (p h + I) <= budget (C11': Gamma_n <= Gamma^max with S_n given), clipped to
    [0, p_cap]; where Gamma^max cannot be reached within C6/C8' (budget <= 0 or p > p_cap) the floor is p_cap,
    the closest to C11 the power can get (the queue Y_n enforces the long-term C10')."""
    budget, scale_c, gain = (np.asarray(a, dtype=float) for a in (budget, scale_c, gain))
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(budget > 0, (scale_c / np.where(budget > 0, budget, 1.0) - interference) / gain, np.inf)
    need = np.where(scale_c <= 0, 0.0, need)
    return np.where(need > p_cap, p_cap, np.clip(need, 0.0, None))


@dataclass(frozen=True)
class _PairTerms:
    """Per-pair terms of f (eq. 42 divided by A = V D ln2 / B_j), with safe placeholders on infeasible pairs:
    a_g, a_l, g, I, I' = I + B N_0, e (C8'), the x range [g p_C11, g P^max] (C11', C6/C8') and the curvature c."""

    a_g: np.ndarray
    a_l: np.ndarray
    g: np.ndarray
    I: np.ndarray
    Ip: np.ndarray
    energy: np.ndarray
    x_max: np.ndarray
    x_min: np.ndarray
    c: np.ndarray

    def f_at(self, x, idx):
        """f(x) = 1 / R(x) + a_g / (I + I' x) + a_l x / g for the pairs ``idx``."""
        with np.errstate(divide="ignore"):
            return (
                1.0 / np.log1p(x) + self.a_g[idx] / (self.I[idx] + self.Ip[idx] * x) + self.a_l[idx] * x / self.g[idx]
            )

    def f(self, x):
        return self.f_at(x, slice(None))

    def f_prime(self, x):
        """f'(x) for every pair (-inf at x = 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            d = (
                -1.0 / ((1 + x) * np.log1p(x) ** 2)
                - self.a_g * self.Ip / (self.I + self.Ip * x) ** 2
                + self.a_l / self.g
            )
        return np.where(x > 0, d, -np.inf)

    def surrogate_values(self, idx, xi, lam) -> dict[str, np.ndarray]:
        """Parameter values of the SCA surrogate of Phi_lambda around x_i for the pairs ``idx``."""
        return {
            "q_ent": self.a_l[idx] / self.g[idx],
            "mu": lam[idx] + self.a_l[idx] / self.g[idx],
            "lin": self.a_g[idx] * (_rho_prime(xi, self.I[idx], self.Ip[idx]) - self.c[idx] * xi),
            "quad": self.a_g[idx] * self.c[idx] / 2,
            "eg": self.energy[idx] / self.g[idx],
            "x_max": self.x_max[idx],
            "x_min": self.x_min[idx],
        }


def _pair_terms(ok, V, bits, B, g, h, I, w_gamma, w_lin, energy, p_cap, p_floor) -> _PairTerms:
    """Scale eq. (42) by A = V D ln2 / B per feasible pair and bound x to [g p_C11, g p_cap] (C11'; p_cap: the
    largest power within C6 and C8').

    Over eight parameters: one per symbol of eq. (42) and its bounds C6/C8'/C11', plus the feasibility mask ``ok``.
    They are V, D, B, g, h, I, w_gamma, w_lin, e = D ln2 / (B E^max), p_cap and p_C11, flat arrays over the pairs
    (the caller broadcast them together from its PowerProblem) combined element-wise."""
    A = np.where(ok, V * bits * LN2 / B, 1.0)
    a_g, a_l = np.where(ok, w_gamma / A, 0.0), np.where(ok, w_lin / A, 0.0)
    g_safe = np.where(ok, g, 1.0)
    Ip = np.where(ok, h / g_safe, 1.0)  # I + B N_0
    I_ = np.where(ok, I, 1.0)
    p_cap = np.where(ok, p_cap, 0.0)
    x_max = g_safe * p_cap
    x_min = np.minimum(g_safe * np.clip(p_floor, 0.0, None), x_max)
    c = np.where(ok, curvature_bound(I_, Ip), 0.0)
    return _PairTerms(a_g, a_l, g_safe, I_, Ip, energy, x_max, x_min, c)


def _dinkelbach_step(terms: _PairTerms, idx, x, lam) -> np.ndarray | None:
    """One SCA solve for the active pairs ``idx``: x and lambda (updated in place) move to the new point where it
    lowers f; returns the relative decrease -F(lambda) / (lambda R(x_new)) per pair, None if the solve failed."""
    xi = x[idx]
    x_new = _solve_surrogate(terms.surrogate_values(idx, xi, lam), xi)
    if x_new is None:
        return None
    x_new = np.clip(x_new, terms.x_min[idx], terms.x_max[idx])
    f_new = terms.f_at(x_new, idx)
    better = np.isfinite(f_new) & (f_new < lam[idx])
    decrease = np.where(better, (lam[idx] - f_new) / lam[idx], 0.0)  # = -F(lambda) / (lambda R(x_new))
    x[idx] = np.where(better, x_new, xi)
    lam[idx] = np.where(better, f_new, lam[idx])
    return decrease


def dinkelbach_sca_power(problem: PowerProblem, tol: float = 1e-9, max_iters: int = 30) -> PowerResult:
    """Optimal p per pair of ``problem`` by Dinkelbach + SCA (see module docstring); stops when every pair's
    relative decrease of f is at most ``tol`` or after ``max_iters`` surrogate solves."""
    q = problem
    inputs = (
        q.V,
        q.bits,
        q.bandwidth,
        q.slope,
        q.gain,
        q.interference,
        q.w_gamma,
        q.w_lin,
        q.energy_max,
        q.pmax,
        q.p_floor,
    )
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in inputs))
    shape = arrays[0].shape
    V, bits, B, g, h, I, w_gamma, w_lin, E, pmax, p_floor = (a.ravel().copy() for a in arrays)
    energy = bits * LN2 / (B * E)
    ok = feasible_pairs(g, energy)
    power = np.full(V.size, np.nan)
    if not ok.any():
        return PowerResult(power.reshape(shape), 0, ())
    if problem.p_cap is None:
        p_cap = max_energy_power(np.where(ok, g, 1.0), np.where(ok, energy, 0.0), pmax)
    else:
        p_cap = np.broadcast_to(np.asarray(problem.p_cap, dtype=float), shape).ravel()
    terms = _pair_terms(ok, V, bits, B, g, h, I, w_gamma, w_lin, energy, p_cap, p_floor)
    x = terms.x_max.copy()  # warm start: the largest C6/C8'-feasible power
    lam = np.where(ok, terms.f(x), 0.0)
    # f is convex, so f'(x_max) <= 0 means f is non-increasing on [x_min, x_max]: x_max attains min f and
    # F(lambda_0) = 0 exactly (Phi_lambda0(x) = R(x)(f(x) - f(x_max)) >= 0), and Dinkelbach stops at its warm
    # start. This always holds when a_l = 0 (f = 1/R + a_g/(I + I'x) decreases), and for pairs whose C8' range
    # is so short that the delay term dominates (which would otherwise only make the conic problem ill-scaled).
    active = ok & (terms.a_l > 0) & (terms.f_prime(terms.x_max) > 0) & (terms.x_max > terms.x_min)
    residuals: list[float] = []
    iterations = 0
    for _ in range(max_iters):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        decrease = _dinkelbach_step(terms, idx, x, lam)
        iterations += 1
        if decrease is None:
            break
        residuals.append(float(decrease.max()))
        active[idx] = decrease > tol
    power[ok] = x[ok] / terms.g[ok]
    return PowerResult(power.reshape(shape), iterations, tuple(residuals))
