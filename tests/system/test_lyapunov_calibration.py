"""The calibrated convergence constants (conf/scheduler/dssra.yaml) make C10 bind: eq. (28) and the queue
of eq. (29) by hand on a hand-made sequence of rounds, the Gamma^max reading (fair_share_gamma) by hand, and
the DSSRA policy in the default setting has Y_n > 0 in some rounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collapipe_flwr.apps.simulate import generic_workload
from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.policies import make_policy
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.system.convergence import (
    ConvergenceParams,
    calibrated_gamma_max,
    fair_share_gamma,
    queue_update,
)
from collapipe_flwr.system.state import StateSampler
from tests.conf_files import conf_group

CONV = conf_group("scheduler", "dssra")["convergence"]
N, L = 2, 3  # the default setting: federation small, transformer_small


def gamma_by_hand(S: int, p: float, h: float, interference: float) -> float:
    """Eq. (28) written out: beta eta^2 / (2N) (phi^2 S^2 / L + C / (p h + I) + phi^2)."""
    beta, eta, phi, C = CONV["beta"], CONV["eta"], CONV["grad_bound"], CONV["interference_c"]
    return beta * eta**2 / (2 * N) * (phi**2 * S**2 / L + C / (p * h + interference) + phi**2)


def test_gamma_max_is_the_documented_reading():
    """Gamma^max = 1.07 x Gamma at S = 1, p = P^max = 0.5 W, h = -0.1 dB, I = 0.07 W (both CUs on a channel)."""
    h = 10 ** (-0.1 / 10)
    expected = 1.07 * gamma_by_hand(1, 0.5, h, 0.07)
    assert CONV["gamma_max"] == pytest.approx(expected, rel=0.01)
    params = ConvergenceParams(**{k: CONV[k] for k in CONV}, num_clusters=N, num_blocks=L)
    assert fair_share_gamma(params, 1, 0.5, h, 0.07, J=2) == pytest.approx(expected / 1.07, rel=1e-12)
    # N = 10 CUs on J = 4 channels: 4 of 10 send, 6 sit out with p = 0 (the value the selection runs use)
    share = ConvergenceParams(**{k: CONV[k] for k in CONV}, num_clusters=10, num_blocks=L)
    by_hand = 0.4 * gamma_by_hand(1, 0.5, h, 0.07) * N / 10 + 0.6 * gamma_by_hand(1, 0.0, h, 0.07) * N / 10
    assert fair_share_gamma(share, 1, 0.5, h, 0.07, J=4) == pytest.approx(by_hand, rel=1e-12)


def test_the_calibrated_gamma_max_is_the_documented_reading_in_any_setting():
    """The conf's 3.5 back at the default setting, and the paper's N = 3, L = 6, J = 4 by hand: all three CUs send,
    so 1.07 x eq. (28) at S = 1, P^max = 0.5 W, h = -0.1 dB, I = 0.07 W with 1/(2N) = 1/6 and S^2/L = 1/6."""
    h = 10 ** (-0.1 / 10)
    default = ConvergenceParams(**{k: CONV[k] for k in CONV}, num_clusters=N, num_blocks=L)
    assert calibrated_gamma_max(default, 0.5, h, 0.07, J=2) == pytest.approx(CONV["gamma_max"], rel=0.01)
    beta, eta, phi, C = CONV["beta"], CONV["eta"], CONV["grad_bound"], CONV["interference_c"]
    by_hand = 1.07 * beta * eta**2 / 6 * (phi**2 / 6 + C / (0.5 * h + 0.07) + phi**2)
    paper = ConvergenceParams(**{k: CONV[k] for k in CONV}, num_clusters=3, num_blocks=6)
    assert calibrated_gamma_max(paper, 0.5, h, 0.07, J=4) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(2.074, abs=1e-3)  # well under the conf's 3.5, which the default setting fits


def test_hand_made_rounds_make_the_queue_grow_and_c10_bind():
    """A CU pipelining over S = 2 devices, then a deep fade, then good rounds at S = 1: Y grows above 0 and
    drains again, exactly as Y(t+1) = max(Y(t) + Gamma(t) - Gamma^max, 0) by hand."""
    h = 10 ** (-0.1 / 10)
    rounds = [(2, 0.5, h, 0.07), (2, 0.5, h, 0.07), (1, 0.5, 0.01 * h, 0.07), (1, 0.5, h, 0.07), (1, 0.5, h, 0.07)]
    params = ConvergenceParams(**{k: CONV[k] for k in CONV}, num_clusters=N, num_blocks=L)
    gmax = CONV["gamma_max"]
    Y_hand, Y_code, history = 0.0, np.zeros(1), []
    for S, p, g, interference in rounds:
        gamma = gamma_by_hand(S, p, g, interference)
        assert params.gamma(S, p, g, interference) == pytest.approx(gamma, rel=1e-12)
        Y_hand = max(Y_hand + gamma - gmax, 0.0)
        Y_code = queue_update(Y_code, [gamma], gmax)
        assert Y_code[0] == pytest.approx(Y_hand, rel=1e-12, abs=1e-15)
        history.append(Y_hand)
    # S = 2: Gamma = 0.0025 (900 * 4/3 + 63/(0.5 h + 0.07) + 900) ~ 5.88 > 3.5, so Y rises by ~2.38 a round
    assert history[0] == pytest.approx(gamma_by_hand(2, 0.5, h, 0.07) - gmax) and history[0] > 2
    assert history[1] > history[0] > 0  # C10 binds: the queue is positive and growing
    assert history[2] > history[1]  # a deep fade (C / (p h + I) large) at S = 1 still exceeds Gamma^max
    assert history[3] < history[2] and history[4] < history[3]  # good S = 1 rounds drain it
    assert math.isclose(history[4], max(history[3] + gamma_by_hand(1, 0.5, h, 0.07) - gmax, 0.0))


def test_default_setting_has_positive_queues_in_some_rounds():
    """The DSSRA policy in the default setting (network edge sized to the model, N = 3, one batch a round) over 60
    rounds of random channels: some Y_n > 0 (before the calibration, Gamma never exceeded Gamma^max and Y_n stayed
    0)."""
    cfg = load_run_config(["scheduler=dssra", "federation.local_steps=1"])
    sizes = cfg.model.sizes
    workload = generic_workload(
        cfg.model.width, sizes["n_heads"], sizes["d_ff"], sizes["enc_layers"], cfg.task.max_len, cfg.task.batch_size, 1
    )
    network = cfg.network.sized_to(workload.encoder_memory_bytes)
    policy = make_policy(cfg.scheduler, network, workload, cfg.seed)
    sampler = StateSampler(network, cfg.seed)
    positive = 0
    for t in range(60):
        plan = policy.plan(t, sampler.sample(t))
        positive += any(row.Y > 0 for row in plan.modelled.clusters)
        policy.observe(plan, {})
    assert 0 < positive < 60, positive


def test_simulate_run_splits_each_round_delay_into_the_bottleneck_parts():
    """simulate.run's per-round record: the slowest selected CU's tau^pipe + uplink is the round delay tau(t)
    (eq. 26, read off the cumulative delay), and no more CUs than the J = 4 channels are selected (N = 10)."""
    from collapipe_flwr.apps.simulate import run

    cfg = load_run_config(["network=selection", "federation.num_clusters=10", "scheduler.convergence.gamma_max=0.95"])
    workload = generic_workload(64, 4, 128, 3, 16, 64, 1)
    for policy in ("dssra", "delay_only"):
        out = run(policy, 6, cfg.network, workload, cfg.scheduler, seed=0)
        per_round = np.diff([0.0, *out["cumulative_s"]])
        parts = np.add(out["bottleneck_pipeline_s"], out["bottleneck_uplink_s"])
        assert parts == pytest.approx(per_round, rel=1e-9)
        assert all(1 <= k <= 4 for k in out["selected"])


def test_gamma_max_auto_is_calibrated_for_the_runs_own_setting_and_recorded_in_its_plans():
    """``scheduler.convergence.gamma_max=auto`` at the paper's N = 3 (J = 4: every CU sends) with L = 6 blocks: the
    policy's Gamma^max is 1.07 x eq. (28) by hand at S = 1, P^max and the network's mean gain and interference."""
    cfg = load_run_config(
        ["network=testbed_paper", "federation.num_clusters=3", "scheduler.convergence.gamma_max=auto"]
    )
    assert cfg.scheduler.gamma_max_auto
    assert cfg.scheduler.to_raw()["convergence"]["gamma_max"] == "auto"  # written back as the user gave it
    workload = generic_workload(64, 4, 128, 6, 16, 8, 1)
    network = cfg.network.sized_to(workload.encoder_memory_bytes)
    h = 10 ** (float(np.mean(network.uplink_mean_gain_db)) / 10)
    interference = float(np.mean(network.uplink_interference_w))
    beta, eta, phi, C = CONV["beta"], CONV["eta"], CONV["grad_bound"], CONV["interference_c"]
    by_hand = 1.07 * beta * eta**2 / 6 * (phi**2 / 6 + C / (0.5 * h + interference) + phi**2)
    policy = make_policy(cfg.scheduler, network, workload, cfg.seed)
    assert policy.conv.gamma_max == pytest.approx(by_hand, rel=1e-12)
    plan = policy.plan(0, StateSampler(network, cfg.seed).sample(0))
    assert plan.modelled is not None and plan.modelled.gamma_max == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("value", ["fast", 0, -1.0])
def test_a_gamma_max_that_is_neither_positive_nor_auto_is_one_config_error(value):
    with pytest.raises(ConfigError, match=r"scheduler\.convergence\.gamma_max=.* or auto"):
        load_run_config([f"scheduler.convergence.gamma_max={value}"])
