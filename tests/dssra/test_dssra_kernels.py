"""The vectorised kernels behind DSSRA's solve time, each against a slow reference written out here:
T*(m, S) and the partition (stage_times.py) against enumeration of every delta, the micro-batch sizes
Sub-1 tries, the stacked cost model against the per-cluster one, the batched Sub-1 against solve_segments
cluster by cluster, and the C8' power cap against a plain 80-step bisection."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from collapipe_flwr.dssra.power import max_energy_power
from collapipe_flwr.dssra.segments import StageTables, distinct_b_hat, solve_segments, solve_tables, stack_models
from collapipe_flwr.dssra.stage_times import min_stage_times, partitions
from collapipe_flwr.errors import InfeasiblePlanError
from tests.dssra.test_dssra_bruteforce import all_deltas, random_model


def brute_stage_time(compute, d2d, cap, L: int, S: int) -> float:
    """min over every delta on exactly S devices (sum L, delta_k <= cap_k) of its slowest chunk."""
    best = math.inf
    for delta in all_deltas(len(compute), L):
        if int((delta > 0).sum()) != S or (delta > cap).any():
            continue
        used = delta > 0
        best = min(best, float(np.max(delta[used] * compute[used] + d2d[used])))
    return best


def random_times(rng: np.random.Generator, shape: tuple[int, ...], L: int):
    compute = rng.uniform(0.01, 0.1, shape)
    if rng.random() < 0.5:  # coarse values: many equal chunk times
        compute = np.round(compute, 2)
    d2d = np.round(rng.uniform(0.0, 0.1, shape), int(rng.choice([2, 12])))
    compute[rng.random(shape) < 0.1] = np.inf
    cap = rng.integers(0, L + 2, shape)
    return compute, d2d, cap


def test_min_stage_times_equal_enumeration_ties_included():
    rng = np.random.default_rng(7)
    for _ in range(150):
        K, L, M = int(rng.integers(1, 6)), int(rng.integers(1, 8)), int(rng.integers(1, 3))
        compute, d2d, cap = random_times(rng, (M, K), L)
        T = min_stage_times(compute, d2d, cap, L)
        for i in range(M):
            for S in range(1, K + 1):
                assert T[i, S - 1] == brute_stage_time(compute[i], d2d[i], cap[i], L, S)


def test_min_stage_times_batched_equals_one_cluster_at_a_time():
    rng = np.random.default_rng(8)
    compute, d2d, cap = random_times(rng, (5, 4, 6), 7)
    T = min_stage_times(compute, d2d, cap, 7)
    for n in range(5):
        assert np.array_equal(T[n], min_stage_times(compute[n], d2d[n], cap[n], 7))


def test_partitions_meet_the_stage_time_on_exactly_s_devices():
    rng = np.random.default_rng(9)
    for _ in range(200):
        K, L = int(rng.integers(1, 7)), int(rng.integers(1, 10))
        compute, d2d, cap = random_times(rng, (1, K), L)
        T = min_stage_times(compute, d2d, cap, L)[0]
        for S in np.nonzero(np.isfinite(T))[0] + 1:
            delta = partitions(compute, d2d, cap, L, np.array([S]), T[S - 1 : S])[0]
            used = delta > 0
            assert delta.sum() == L and used.sum() == S and (delta <= cap[0]).all()  # C1, C2, C7/C9'
            assert np.max(delta[used] * compute[0, used] + d2d[0, used]) <= T[S - 1]


def test_distinct_b_hat_keeps_the_first_m_of_each_micro_batch_size():
    for b in (1, 7, 16, 64, 100):
        m_values = np.arange(1, b + 1)
        seen: set[int] = set()
        expected = []
        for m in m_values:
            expected.append(math.ceil(b / m) not in seen)
            seen.add(math.ceil(b / m))
        assert distinct_b_hat(b, m_values).tolist() == expected
    assert distinct_b_hat(16, np.array([4, 2, 3])).all()  # not increasing: every m is kept


def shared_models(rng: np.random.Generator, count: int):
    """``count`` random clusters with the same K, L, b, steps and constants (only the devices differ)."""
    first = random_model(rng)
    models = [first]
    while len(models) < count:
        other = random_model(rng)
        if other.K != first.K:
            continue
        per_device = {f: getattr(other, f) for f in ("flops_per_second", "f_hz", "d2d_rate", "d2d_power")}
        cap = np.minimum(other.memory_cap, first.num_blocks)
        models.append(replace(first, cluster=len(models), memory_cap=cap, **per_device))
    return models


def test_stacked_model_gives_each_cluster_its_own_numbers():
    rng = np.random.default_rng(10)
    models = shared_models(rng, 4)
    stacked = stack_models(models)
    m = np.arange(1, models[0].batch_size + 1)
    for n, model in enumerate(models):
        assert np.array_equal(stacked.compute_per_block(m)[n], model.compute_per_block(m))
        assert np.array_equal(stacked.chunk_fixed(m)[n], model.chunk_fixed(m))
        assert np.array_equal(stacked.block_cap(m)[n], model.block_cap(m))
    with pytest.raises(ValueError, match="does not stack"):
        stack_models([models[0], replace(models[1], energy_max=models[0].energy_max + 1.0)])


def test_batched_sub1_equals_solve_segments_cluster_by_cluster():
    rng = np.random.default_rng(11)
    for _ in range(20):
        models = shared_models(rng, 5)
        K, V = models[0].K, float(10 ** rng.uniform(-2, 2))
        m_values = range(1, models[0].batch_size + 1)
        drift = np.concatenate([np.zeros((5, 1)), np.sort(rng.uniform(0, 5, (5, K)), axis=1)], axis=1)
        idle = rng.random(5) < 0.5
        plans = solve_tables(StageTables.build(models, m_values, V), range(5), V, drift, idle)
        for n, model in enumerate(models):
            try:
                expected = solve_segments(model, V, drift[n], m_values, idle=bool(idle[n]))
            except InfeasiblePlanError:
                assert plans[n] is None
                continue
            assert plans[n] == expected


def bisection_reference(slope, energy, pmax):
    """The plain bisection: 80 halvings of [0, pmax] on C8' for every pair."""
    lo, hi = np.zeros_like(pmax), np.array(pmax, dtype=float)
    ok_hi = energy * hi <= np.log1p(slope * hi)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        ok = energy * mid <= np.log1p(slope * mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(ok_hi, pmax, lo)


@pytest.mark.parametrize("ratio", ["spread", "near_one"])
def test_max_energy_power_equals_plain_bisection(ratio):
    rng = np.random.default_rng(12)
    slope = 10 ** rng.uniform(-3, 3, (40, 50))
    factor = (
        rng.uniform(0, 1.3, slope.shape)
        if ratio == "spread"
        else 1 + rng.choice([-1, 1]) * 10 ** rng.uniform(-12, -6, slope.shape)
    )
    energy = slope * factor
    pmax = rng.uniform(0.01, 1.0, slope.shape)
    got = max_energy_power(slope, energy, pmax)
    assert got.shape == slope.shape
    assert np.array_equal(got, bisection_reference(slope, energy, pmax))
    assert (energy * got <= np.log1p(slope * got)).all()  # C8' holds at the cap
