"""Eqs. (15)-(16) under ``pipeline.checkpoint``: a re-materialized micro-batch's backward first runs its segment's
forward again, so its chunk computes delta_k b_hat (o_l + o_l + o'_l) / (phi_k f_k) and its energy one forward more.
Checked by hand from the paper's formula, and the critical path against ``pipeline/schedule.py``'s over call
durations built here (an independent reference: it walks the stages' call orders)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from collapipe_flwr.pipeline.schedule import stage_order_critical_path_s
from collapipe_flwr.system.pipeline_model import (
    checkpoint_stop,
    chunk_compute_delay,
    compute_energy,
    pipeline_delay,
    recomputed_micro_batches,
)

MODES = ("never", "except_last", "always")


def test_recomputed_micro_batches_is_the_checkpoint_stop_for_one_m_or_many():
    m = np.array([1, 2, 5])
    assert recomputed_micro_batches("always", m).tolist() == [1, 2, 5]
    assert recomputed_micro_batches("except_last", m).tolist() == [0, 1, 4]
    assert recomputed_micro_batches("never", m).tolist() == [0, 0, 0]
    for mode in MODES:
        assert [int(recomputed_micro_batches(mode, k)) for k in range(1, 7)] == [
            checkpoint_stop(mode, k) for k in range(1, 7)
        ]
    with pytest.raises(ValueError, match="checkpoint 'sometimes' must be one of"):
        recomputed_micro_batches("sometimes", 4)


def test_the_recomputed_chunk_is_the_hand_formula_with_one_more_forward():
    """delta_k = 3, b_hat = 4, o_l = 2e6, o'_l = 4e6, phi_k f_k = 1e9: 3 * 4 * (2e6 + 2e6 + 4e6) / 1e9 = 0.096 s."""
    o, o_prime = 2e6, 4e6
    plain = chunk_compute_delay(3, 4, o + o_prime, 1e9)
    recompute = chunk_compute_delay(3, 4, o, 1e9)
    assert plain == pytest.approx(0.072)
    assert plain + recompute == pytest.approx(0.096)
    assert chunk_compute_delay(3, 4, o + o + o_prime, 1e9) == pytest.approx(0.096)


def test_pipeline_delay_by_hand_for_every_mode():
    """S = 3, m = 4; chunks (c0 + tau^dd included) 0.10 / 0.14 / 0.12 s, recomputed 0.13 / 0.19 / 0.16 s."""
    chunk, recomputed = [0.10, 0.14, 0.12], [0.13, 0.19, 0.16]
    never = pipeline_delay(chunk, 3, 4)
    assert never == (3 + 4 - 1) * 0.14  # eq. (15), the very same expression as before
    assert pipeline_delay(chunk, 3, 4, recomputed, 0) == never  # never: the recomputed chunks are not read
    assert pipeline_delay(chunk, 3, 4, recomputed, 4) == pytest.approx(6 * 0.19)  # always: every clock recomputes
    assert pipeline_delay(chunk, 3, 4, recomputed, 3) == pytest.approx(0.14 + 5 * 0.19)  # except_last
    assert pipeline_delay([], 3, 4, [], 3) == 0.0


def _calls(f: list[float], b: list[float], r: list[float], m: int, stop: int):
    """Call durations [micro-batch i][stage k]: forward f_k; backward b_k, plus the recompute r_k for i < stop."""
    S = len(f)
    forward = [[f[k] for k in range(S)] for _ in range(m)]
    backward = [[b[k] + (r[k] if i < stop else 0.0) for k in range(S)] for i in range(m)]
    return forward, backward


@pytest.mark.parametrize("mode", MODES)
def test_equal_stages_give_the_gpipe_critical_path_of_the_call_orders(mode):
    """Equal stages: forward f = 0.3, backward b = 0.5, recompute = the forward again. The model's
    (m - n^rc) C + (S + n^rc - 1) C^rc equals the critical path walked over GPipe's call orders, and bounds 1F1B's."""
    f, b = 0.3, 0.5
    for S in range(1, 5):
        for m in range(1, 7):
            stop = checkpoint_stop(mode, m)
            forward, backward = _calls([f] * S, [b] * S, [f] * S, m, stop)
            model = pipeline_delay([f + b] * S, S, m, [f + f + b] * S, int(recomputed_micro_batches(mode, m)))
            assert model == pytest.approx(stage_order_critical_path_s(forward, backward, "gpipe")), (S, m)
            assert model >= stage_order_critical_path_s(forward, backward, "1f1b") - 1e-12, (S, m)


@pytest.mark.parametrize("mode", MODES)
def test_unequal_stages_are_bounded_by_the_model(mode):
    """Stage k with x_k blocks-worth of work: forward o x_k, backward o' x_k, recompute o x_k (the model's
    chunks, which scale the same FLOPs by stage): the model is an upper bound on both schedules' critical path."""
    rng = random.Random(7)
    o, o_prime = 1.0, 2.0
    for _ in range(200):
        S, m = rng.randint(1, 5), rng.randint(1, 8)
        x = [rng.uniform(0.1, 2.0) for _ in range(S)]
        stop = checkpoint_stop(mode, m)
        forward, backward = _calls([o * v for v in x], [o_prime * v for v in x], [o * v for v in x], m, stop)
        chunk = [(o + o_prime) * v for v in x]
        recomputed = [(o + o + o_prime) * v for v in x]
        model = pipeline_delay(chunk, S, m, recomputed, int(recomputed_micro_batches(mode, m)))
        for schedule in ("gpipe", "1f1b"):
            assert model >= stage_order_critical_path_s(forward, backward, schedule) - 1e-9, (schedule, S, m, x)


def test_energy_counts_m_chunks_and_the_recomputed_forwards_by_hand():
    """kappa = 1e-28, delta_k = 2, b_hat = 5, o_l = 1e6, o'_l = 3e6, phi_k = 10, f_k = 1e8, m = 4:
    E = kappa (m (o_l + o'_l) + n^rc o_l) delta_k b_hat f_k^2 / phi_k."""
    kappa, delta, b_hat, o, o_prime, phi, f, m = 1e-28, 2, 5, 1e6, 3e6, 10.0, 1e8, 4
    chunks = compute_energy(kappa, delta, b_hat, o + o_prime, phi, f, m)
    assert chunks == pytest.approx(1e-28 * (4 * 4e6) * 2 * 5 * 1e16 / 10)
    for mode, n in (("never", 0), ("except_last", 3), ("always", 4)):
        assert int(recomputed_micro_batches(mode, m)) == n
        total = chunks + compute_energy(kappa, delta, b_hat, o, phi, f, n)
        assert total == pytest.approx(1e-28 * (4 * 4e6 + n * 1e6) * 2 * 5 * 1e16 / 10), mode
