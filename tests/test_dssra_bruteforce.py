"""Sub-1 (exact segment scheduling) against brute-force enumeration of every device subset, every
delta with sum L and every m, on random heterogeneous clusters (K <= 6, L <= 12)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.segments import solve_segments
from collapipe_flwr.errors import InfeasiblePlanError


def all_deltas(K: int, L: int) -> np.ndarray:
    """Every delta in {0..L}^K with sum L (stars and bars)."""
    rows = []
    for bars in itertools.combinations(range(L + K - 1), K - 1):
        cuts = (-1,) + bars + (L + K - 1,)
        rows.append([cuts[i + 1] - cuts[i] - 1 for i in range(K)])
    return np.array(rows, dtype=int)


def random_model(rng: np.random.Generator) -> ClusterModel:
    K = int(rng.integers(1, 7))
    L = int(rng.integers(1, 13))
    b = int(rng.integers(1, 17))
    phi = rng.uniform(10, 24, K)
    f = rng.uniform(0.1e9, 0.8e9, K) * rng.uniform(0.3, 1.0, K)
    return ClusterModel(
        cluster=0,
        num_blocks=L,
        batch_size=b,
        steps=int(rng.integers(1, 4)),
        flops_per_sample_block=float(rng.uniform(1e6, 5e8)),
        activation_bits=float(rng.uniform(1e4, 5e6)),
        flops_per_second=phi * f,
        flops_per_cycle=phi,
        f_hz=f,
        d2d_rate=rng.uniform(1e6, 2e7, K),
        d2d_power=rng.uniform(0.07, 0.1, K),
        memory_cap=rng.integers(0 if rng.random() < 0.1 else 1, L + 1, K),
        energy_max=float(rng.uniform(0.5, 20.0)),
        kappa=1e-28 * float(rng.uniform(0.5, 2)),
    )


def brute_force(model: ClusterModel, V: float, drift: np.ndarray) -> float:
    """min over all (delta, m) of V * tau_pipe + drift(S), every formula written out by hand."""
    K, L, b = model.K, model.num_blocks, model.batch_size
    deltas = all_deltas(K, L)
    deltas = deltas[(deltas <= model.memory_cap[None, :]).all(axis=1)]  # C7
    best = math.inf
    for m in range(1, b + 1):
        b_hat = math.ceil(b / m)
        comp = deltas * b_hat * model.flops_per_sample_block / model.flops_per_second[None, :]
        d2d = b_hat * model.activation_bits / model.d2d_rate
        used = deltas > 0
        chunk = np.where(used, comp + d2d[None, :], -np.inf).max(axis=1)
        S = used.sum(axis=1)
        cycles = deltas * b_hat * model.flops_per_sample_block / model.flops_per_cycle[None, :]
        energy = model.steps * (m * model.kappa * cycles * model.f_hz[None, :] ** 2 + m * model.d2d_power * d2d)
        energy = np.where(used, energy, 0.0)
        feasible = (energy <= model.energy_max * (1 + 1e-12)).all(axis=1)  # C9'
        if not feasible.any():
            continue
        obj = V * model.steps * (S + m - 1) * chunk + drift[S]
        best = min(best, float(obj[feasible].min()))
    return best


def test_sub1_equals_brute_force_on_200_random_clusters():
    rng = np.random.default_rng(1234)
    solved = infeasible = 0
    for _ in range(400):
        if solved >= 200 and infeasible >= 5:
            break
        model = random_model(rng)
        V = float(10 ** rng.uniform(-2, 2))
        drift = np.concatenate([[0.0], np.sort(rng.uniform(0, 5, model.K)) * rng.choice([0.0, 1.0, 50.0])])
        expected = brute_force(model, V, drift)
        m_values = range(1, model.batch_size + 1)
        if math.isinf(expected):
            with pytest.raises(InfeasiblePlanError, match=r"C[79]"):
                solve_segments(model, V, drift, m_values)
            infeasible += 1
            continue
        plan = solve_segments(model, V, drift, m_values)
        assert plan.objective == pytest.approx(expected, rel=1e-9)
        # the returned plan itself achieves the objective and satisfies C1, C2, C7, C9'
        delta = np.array(plan.delta)
        assert delta.sum() == model.num_blocks and (delta >= 0).all()
        assert plan.S == int((delta > 0).sum())
        assert (delta <= model.memory_cap).all()
        assert model.energy_ok(delta, plan.m).all()
        ev = model.evaluate(delta, plan.m)
        assert V * ev["pipeline_s"] + drift[plan.S] == pytest.approx(expected, rel=1e-9)
        solved += 1
    assert solved >= 200 and infeasible >= 5, (solved, infeasible)
