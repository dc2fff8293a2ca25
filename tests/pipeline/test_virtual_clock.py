"""The virtual clock (pipeline/virtual_clock.py) against eq. (15) by hand, a longest path over the 1F1B order and
eq. (11) by hand; and a real step's calls measured in every call (pipeline/stage.py)."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from torch import nn

from collapipe_flwr.pipeline.schedule import one_f_one_b_order, stage_order_critical_path_s
from collapipe_flwr.pipeline.timings import CallCpu
from collapipe_flwr.pipeline.virtual_clock import ClusterClock, StepCalls, virtual_step, virtual_steps, virtual_users
from tests.workloads import random_call_times


def _clock(K, scale=1.0, rate=0.0, latency=0.0, uplink=0.0):
    return ClusterClock((scale,) * K, (rate,) * K, (latency,) * K, uplink)


def _uniform_step(devices, m, f, b, u=0.0, nbytes=0):
    """A step whose every forward takes f CPU seconds, backward b, update u, each handing on ``nbytes``."""
    stages = []
    for k in devices:
        calls = [CallCpu("F", i, f, nbytes) for i in range(m)]
        calls += [CallCpu("B", i, b, nbytes) for i in reversed(range(m))]
        calls.append(CallCpu("U", -1, u))
        stages.append((k, tuple(calls)))
    return StepCalls(tuple(stages))


@pytest.mark.parametrize(("S", "m"), [(1, 1), (2, 4), (3, 2), (3, 8)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_calls_give_eq_15_cycles_scaled_by_the_device_speed(S, m, schedule):
    f, b, scale = 0.01, 0.02, 4.0  # a device 4x slower than the host
    got = virtual_step(_uniform_step(range(S), m, f, b), _clock(S, scale=scale), schedule)
    assert got.compute == pytest.approx((S + m - 1) * (f + b) * scale)
    assert got.d2d == pytest.approx(0.0)
    assert got.device == pytest.approx(tuple([m * (f + b) * scale] * S))


def test_hand_overs_add_eq_13_per_clock_cycle_less_the_last_stages():
    # eq. (15): (S + m - 1) max_k(compute + tau^dd) - tau^dd, per pass; tau^dd = bytes / r + tau_0 / 2 per hand-over
    S, m, f, b, nbytes, rate, tau0 = 3, 4, 0.01, 0.02, 1000, 1e5, 0.004
    step = _uniform_step(range(S), m, f, b, nbytes=nbytes)
    got = virtual_step(step, _clock(S, rate=rate, latency=tau0))
    h = nbytes / rate + tau0 / 2
    with_links = (S + m - 1) * (f + h) - h + (S + m - 1) * (b + h) - h
    assert got.compute + got.d2d == pytest.approx(with_links)
    assert got.compute == pytest.approx((S + m - 1) * (f + b))


def test_the_uplink_is_the_last_stages_outputs_at_the_planned_rate():
    S, m, nbytes, up = 2, 4, 4096, 1e6
    got = virtual_step(_uniform_step(range(S), m, 0.01, 0.01, nbytes=nbytes), _clock(S, uplink=up))
    assert got.uplink == pytest.approx(m * nbytes / up)  # eq. (11)'s z_enc term
    local = virtual_steps([_uniform_step(range(S), m, 0.01, 0.01, nbytes=nbytes)], _clock(S, uplink=up), "gpipe", False)
    assert local.uplink == 0.0  # a CU-trained head: nothing crosses the uplink per step


def test_each_stage_updates_behind_its_last_backward():
    # stage 1's update runs while stage 0 is still on its backwards; stage 0's adds after its last backward
    step = StepCalls(
        (
            (0, (CallCpu("F", 0, 1.0), CallCpu("B", 0, 1.0), CallCpu("U", -1, 0.5))),
            (1, (CallCpu("F", 0, 1.0), CallCpu("B", 0, 1.0), CallCpu("U", -1, 0.7))),
        )
    )
    assert virtual_step(step, _clock(2)).compute == pytest.approx(4.5)


def test_devices_of_unequal_speed_scale_their_own_calls():
    step = _uniform_step([0, 1], 1, 1.0, 1.0)
    clock = ClusterClock((1.0, 3.0), (0.0, 0.0), (0.0, 0.0))
    got = virtual_step(step, clock)
    assert got.compute == pytest.approx(1 + 3 + 3 + 1)  # F0, F1 (x3), B1 (x3), B0
    assert got.device == pytest.approx((2.0, 6.0))


def _longest_path_1f1b(forward, backward):
    """1F1B as a DAG by hand: each call after its predecessor in its stage's order and its data dependence."""
    m, S = len(forward), len(forward[0])
    orders = [one_f_one_b_order(k, S, m) for k in range(S)]
    position = {(op, k): j for k in range(S) for j, op in enumerate(orders[k])}

    @functools.cache
    def finish(kind, i, k):
        j = position[((kind, i), k)]
        preds = [finish(*orders[k][j - 1], k)] if j else []
        if kind == "F" and k:
            preds.append(finish("F", i, k - 1))
        if kind == "B":
            preds.append(finish("B", i, k + 1) if k < S - 1 else finish("F", i, S - 1))
        return max(preds, default=0.0) + (forward if kind == "F" else backward)[i][k]

    return max(finish(kind, i, k) for k in range(S) for kind, i in orders[k])


def test_1f1b_critical_path_equals_a_longest_path_over_random_calls():
    rng = random.Random(3)
    for _ in range(30):
        S, m = rng.randint(1, 4), rng.randint(1, 6)
        forward, backward = random_call_times(rng, S, m)
        got = stage_order_critical_path_s(forward, backward, "1f1b")
        assert got == pytest.approx(_longest_path_1f1b(forward, backward))


def test_data_users_run_at_once_so_the_slowest_sets_the_cluster():
    fast = [_uniform_step([0], 1, 1.0, 1.0)] * 2
    slow = [_uniform_step([1], 1, 1.0, 1.0)] * 2
    clock = ClusterClock((1.0, 2.0), (0.0, 0.0), (0.0, 0.0))
    got = virtual_users([fast, slow], clock)
    assert got.compute == pytest.approx(2 * 2 * 2.0)  # the slow user's two steps
    assert got.device == pytest.approx((4.0, 8.0))


def test_a_clock_refuses_rates_of_the_wrong_length_or_sign():
    with pytest.raises(ValueError, match="one scale"):
        ClusterClock((1.0, 1.0), (0.0,), (0.0, 0.0))
    with pytest.raises(ValueError, match="finite"):
        ClusterClock((0.0,), (0.0,), (0.0,))
    clock = ClusterClock((2.0, 1.0), (1e6, 2e6), (0.001, 0.002), 5e5, 3e10)
    assert ClusterClock.from_dict(clock.to_dict()) == clock


class _Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x, mask):
        return torch.tanh(self.lin(x))


def test_a_stage_reports_each_calls_thread_cpu_and_bytes_and_excludes_the_emulated_sleep():
    from collapipe_flwr.pipeline.optim import OptimizerSpec
    from collapipe_flwr.pipeline.stage import Stage

    width = 64
    stage = Stage(0, nn.ModuleList([_Block(width)]), OptimizerSpec(name="sgd", lr=0.1), slowdown=3.0)
    stage.begin_step()
    x, mask = torch.randn(4, 8, width), torch.ones(4, 8)
    outs = [stage.forward(i, x, mask) for i in range(2)]
    for i in reversed(range(2)):
        stage.backward(i, torch.ones_like(outs[i]))
    result = stage.step()
    kinds = [(c.kind, c.micro_batch) for c in result.calls]
    assert kinds == [("F", 0), ("F", 1), ("B", 1), ("B", 0), ("U", -1)]
    assert all(c.bytes_out == 4 * 8 * width * 4 for c in result.calls if c.kind != "U")
    # the emulated slowdown sleeps 2x each call's time: the wall seconds grow, the thread's CPU does not
    cpu = sum(c.cpu_s for c in result.calls if c.kind != "U")
    assert 0 < cpu < result.compute / 2
