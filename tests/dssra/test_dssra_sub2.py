"""Sub-2: Hungarian channel matching vs brute force; the power step (Dinkelbach + SCA, the DSSRA path, and
the direct convex solver kept as a cross-check) vs a fine 1-D grid search and vs each other."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from collapipe_flwr.dssra.channels import match_channels
from collapipe_flwr.dssra.dinkelbach import PowerProblem, c11_power_floor, dinkelbach_sca_power
from collapipe_flwr.dssra.power import optimal_power


def brute_force_matching(cost: np.ndarray, virtual: np.ndarray) -> float:
    """Cheapest assignment seating min(N, J) CUs on distinct channels, everyone else virtual."""
    N, J = cost.shape
    best = math.inf
    seats = min(N, J)
    for cus in itertools.combinations(range(N), seats):
        for chans in itertools.permutations(range(J), seats):
            total = sum(cost[n, j] for n, j in zip(cus, chans)) + sum(virtual[n] for n in range(N) if n not in cus)
            best = min(best, total)
    return best


def total(cost, virtual, channel) -> float:
    return sum(cost[n, j] if j is not None else virtual[n] for n, j in enumerate(channel))


def test_matching_equals_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(150):
        N, J = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        cost = rng.uniform(0, 10, (N, J))
        virtual = rng.uniform(0, 10, N) * rng.choice([0.0, 1.0])
        channel = match_channels(cost, virtual)
        chosen = [j for j in channel if j is not None]
        assert len(chosen) == len(set(chosen)) == min(N, J)  # C3-C5
        assert total(cost, virtual, channel) == pytest.approx(brute_force_matching(cost, virtual), rel=1e-12)


def test_matching_skips_cus_without_a_feasible_channel():
    cost = np.array([[1.0, np.inf], [np.inf, np.inf], [np.inf, 2.0]])
    assert match_channels(cost, np.zeros(3)) == [0, None, 1]
    cost = np.array([[1.0, np.inf], [3.0, np.inf]])  # both can only use channel 0
    assert match_channels(cost, np.zeros(2)) == [0, None]


def grid_objective(pairs: tuple, i: int, points: int = 200001) -> float:
    """The best objective of pair ``i`` of ``pairs`` (:func:`random_pairs`' arrays) over a grid of ``points`` powers
    in (0, P_max], C8' held; inf where no grid power meets it."""
    V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max = (x[i] for x in pairs)
    p = np.linspace(P_max / points, P_max, points)
    rate = B * np.log2(1 + g * p)
    delay = bits / rate
    ok = p * delay <= E_max
    obj = V * delay + w_gamma / (p * h + I) + w_lin * p
    return float(obj[ok].min()) if ok.any() else math.inf


@pytest.mark.parametrize("seed", range(4))
def test_power_within_half_percent_of_grid_search(seed):
    pairs = random_pairs(seed)
    V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max = pairs
    P = len(V)
    p = optimal_power(V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max)
    checked = 0
    for i in range(P):
        best = grid_objective(pairs, i)
        if math.isinf(best):
            continue
        assert not np.isnan(p[i])  # the grid found a C8'-feasible power, so must the solver
        got_delay = bits[i] / (B[i] * np.log2(1 + g[i] * p[i]))
        assert 0 <= p[i] <= P_max[i]  # C6
        assert p[i] * got_delay <= E_max[i] * (1 + 1e-9)  # C8'
        got = V[i] * got_delay + w_gamma[i] / (p[i] * h[i] + I[i]) + w_lin[i] * p[i]
        assert got <= best * 1.005
        checked += 1
    assert checked >= 20


def random_pairs(seed: int, P: int = 40):
    rng = np.random.default_rng(seed)
    V = 10 ** rng.uniform(-2, 2, P)
    bits = rng.uniform(1e6, 8e7, P)
    B = rng.uniform(4e5, 6e5, P)
    h = 10 ** (rng.uniform(-0.12, -0.08, P) / 10) * rng.exponential(1.0, P)
    I = rng.uniform(0.06, 0.08, P)
    g = h / (I + B * 4e-21)
    w_gamma = rng.uniform(0, 50, P) * rng.choice([0, 1], P)
    w_lin = rng.uniform(0, 500, P) * rng.choice([0, 1], P)
    E_max, P_max = 10.0 * rng.uniform(0.5, 3, P), np.full(P, 0.5)
    return V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max


@pytest.mark.parametrize("seed", range(4))
def test_dinkelbach_sca_within_half_percent_of_grid_and_equal_to_direct(seed):
    """The DSSRA power path (Dinkelbach + SCA, CVXPY) against a fine grid and the direct convex solver."""
    pairs = random_pairs(100 + seed)
    V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max = pairs
    result = dinkelbach_sca_power(PowerProblem(V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max))
    p = result.power_w
    direct = optimal_power(V, bits, B, g, h, I, w_gamma, w_lin, E_max, P_max)
    assert result.iterations >= 2  # interior optima (w_lin > 0) really iterate
    checked = 0
    for i in range(len(V)):
        best = grid_objective(pairs, i)
        if math.isinf(best):
            assert np.isnan(p[i]) and np.isnan(direct[i])
            continue
        delay = bits[i] / (B[i] * np.log2(1 + g[i] * p[i]))
        assert 0 < p[i] <= P_max[i] * (1 + 1e-12)  # C6
        assert p[i] * delay <= E_max[i] * (1 + 1e-9)  # C8'
        got = V[i] * delay + w_gamma[i] / (p[i] * h[i] + I[i]) + w_lin[i] * p[i]
        assert got <= best * 1.005
        ref_delay = bits[i] / (B[i] * np.log2(1 + g[i] * direct[i]))
        ref = V[i] * ref_delay + w_gamma[i] / (direct[i] * h[i] + I[i]) + w_lin[i] * direct[i]
        assert got == pytest.approx(ref, rel=1e-6)
        checked += 1
    assert checked >= 20
    assert result.residuals[-1] <= 1e-6  # -F(lambda)/(lambda R) ~ 0 at the end: Dinkelbach converged


def test_dinkelbach_respects_the_c11_floor():
    """With a C11' lower bound above the unconstrained optimum, the power sits on the bound (grid check)."""
    V, bits, B, g, h, I, _, _, E_max, P_max = random_pairs(7, 12)
    w_lin = np.full(12, 400.0)  # pushes the power down, so a floor binds
    free = dinkelbach_sca_power(PowerProblem(V, bits, B, g, h, I, 0.0, w_lin, E_max, P_max)).power_w
    checked = 0
    for i in range(12):
        q = np.linspace(P_max[i] * 1e-6, P_max[i], 200001)
        delay = bits[i] / (B[i] * np.log2(1 + g[i] * q))
        feasible = q * delay <= E_max[i]
        if not feasible.any() or not np.isfinite(free[i]):
            continue
        cap = q[feasible].max()
        floor = min(1.5 * free[i], cap)
        problem = PowerProblem(V[i], bits[i], B[i], g[i], h[i], I[i], 0.0, w_lin[i], E_max[i], P_max[i], p_floor=floor)
        got = dinkelbach_sca_power(problem).power_w
        obj = np.where(feasible & (q >= floor), V[i] * delay + w_lin[i] * q, np.inf)
        got_delay = bits[i] / (B[i] * np.log2(1 + g[i] * got))
        assert got >= floor * (1 - 1e-7)
        assert V[i] * got_delay + w_lin[i] * got <= obj.min() * 1.005
        if free[i] < 0.99 * cap:
            assert got == pytest.approx(floor, rel=1e-4)  # the floor binds
        checked += 1
    assert checked >= 6


def test_c11_floor_formula_by_hand():
    # scale*C/(p h + I) <= budget  <=>  p >= (scale*C/budget - I)/h
    scale_c, h, I = 0.02, 0.8, 0.07
    assert c11_power_floor(0.1, scale_c, h, I, 0.5) == pytest.approx((0.2 - 0.07) / 0.8)
    assert c11_power_floor(1.0, scale_c, h, I, 0.5) == 0.0  # already met at p = 0
    assert c11_power_floor(0.0, scale_c, h, I, 0.5) == 0.5  # unreachable: as close as C6/C8' allow
    assert c11_power_floor(0.021, scale_c, h, I, 0.5) == 0.5  # needs p > cap


def selection_brute_force(policy, spec, state) -> float:
    """min over every injection of CUs into the J channels (N > J: the rest sit out) of the decomposed P3:
    sum_sel [V (tau_n^pipe + tau_{n,j}^Up) + Y_n s C / (P h_{n,j} + I_j)] + sum_idle [Y_n s C / mean_j I_j]
    + sum_n Y_n s phi^2 S_n^2 / L, each cluster's segments solved for its status (Sub-1 is exact, see
    test_dssra_bruteforce) and the uplink written out (eqs. 10-11) at P_n^max (C8 loose, drift = gamma)."""
    from collapipe_flwr.dssra.cluster_model import ClusterModel
    from collapipe_flwr.dssra.segments import solve_segments

    N, J, V = spec.num_clusters, spec.num_channels, policy.sched.V
    conv = policy.conv
    s, C, phi, L = conv.scale, conv.interference_c, conv.grad_bound, conv.num_blocks
    interf = np.asarray(state.uplink_interference_w, dtype=float)
    sel_cost, idle_cost = np.zeros((N, J)), np.zeros(N)
    for n in range(N):
        model = ClusterModel.build(spec, state, policy.workload, n)
        drift = policy.Y[n] * s * phi**2 * np.arange(model.K + 1) ** 2 / L
        busy = solve_segments(model, V, drift, policy.m_values)  # V tau^pipe + segment drift
        idle = solve_segments(model, V, drift, policy.m_values, idle=True)  # segment drift alone
        idle_cost[n] = idle.objective + policy.Y[n] * s * C / interf.mean()
        for j in range(J):
            B, h = spec.channel_bandwidth_hz[j], state.uplink_gain[n][j]
            P = spec.cu_power_max_w
            up = policy.uplink_bits / (B * math.log2(1 + P * h / (interf[j] + B * spec.noise_psd_w_hz)))
            sel_cost[n, j] = busy.objective + V * up + policy.Y[n] * s * C / (P * h + interf[j])
    best = math.inf
    for cus in itertools.combinations(range(N), min(N, J)):
        for chans in itertools.permutations(range(J), len(cus)):
            value = sum(sel_cost[n, j] for n, j in zip(cus, chans)) + sum(
                idle_cost[n] for n in range(N) if n not in cus
            )
            best = min(best, value)
    return best


@pytest.mark.parametrize("N", [5, 6])
def test_cu_selection_with_more_cus_than_channels_equals_brute_force(N):
    """N > J = 4 on conf/network/selection.yaml: DSSRA's plan (Hungarian with N - J sit-out columns inside
    block coordinate descent) reaches the brute-force optimum over all CU-to-channel injections, with empty
    queues and with random positive queues Y_n; J CUs train, on distinct channels."""
    from collapipe_flwr.dssra.policies import make_policy
    from collapipe_flwr.dssra.specs import parse_scheduler
    from collapipe_flwr.system.network import NetworkSpec
    from collapipe_flwr.system.state import StateSampler
    from tests.conf_files import conf_group
    from tests.workloads import uniform_workload

    spec = NetworkSpec.from_config(conf_group("network", "selection"), N)
    workload = uniform_workload(4, 1e8, 2e4, 1e5, 1e4, 8)
    rng = np.random.default_rng(N)
    for t in range(4):
        sched = parse_scheduler(conf_group("scheduler", "dssra", V=float(rng.choice([0.01, 1.0]))))
        policy = make_policy(sched, spec, workload, 0)
        policy.Y = np.zeros(N) if t == 0 else rng.uniform(0, 20, N)
        state = StateSampler(spec, t).sample(t)
        plan = policy.plan(t, state)
        chosen = [c.channel for c in plan.clusters if c.selected]
        assert len(chosen) == len(set(chosen)) == spec.num_channels  # C3-C5: J of the N CUs train
        assert all(c.power_w == pytest.approx(spec.cu_power_max_w) for c in plan.clusters if c.selected)
        assert plan.modelled.bcd_objective[-1] == pytest.approx(selection_brute_force(policy, spec, state), rel=1e-9)
