"""Plans of the training methods (dssra/methods/): every plan satisfies C1-C9, each method's partition
rule holds (checked by hand), and the modelled delays equal eqs. (10)-(15), (26) recomputed here."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import yaml

from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.methods import make_planner
from collapipe_flwr.dssra.methods.titanic import proportional_split, titanic_segments
from collapipe_flwr.dssra.specs import parse_method, parse_scheduler
from collapipe_flwr.errors import ConfigError, InfeasiblePlanError
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import StateSampler
from collapipe_flwr.system.workload import Workload
from tests.dssra.test_dssra_policies import check_constraints
from tests.workloads import uniform_workload

METHODS = ("collapipe", "collapipe_no_ss", "vanilla_fl", "pipeline", "titanic")
WORKLOAD = uniform_workload(5, 4e8, 8e3, 2e5, 5e4, 16, steps_per_round=2, extra_upload_bytes=1e5, head_bytes=3e5)


def conf(group: str, name: str) -> dict:
    return yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())


def planner(method: str, policy: str = "dssra", clusters: int = 3, seed: int = 0, **net_over):
    net = conf("network", "small")
    net.update(net_over)
    spec = NetworkSpec.from_config(net, clusters)
    sched = dict(conf("scheduler", policy), V=0.5)
    return make_planner(parse_method(conf("method", method)), parse_scheduler(sched), spec, WORKLOAD, seed), spec


def bits_by_hand(method: str) -> float:
    w = WORKLOAD
    z = w.boundary_bytes[-1] * w.batch_size * w.steps_per_round
    model = sum(w.param_bytes) + w.extra_upload_bytes
    return (
        8
        * {
            "collapipe": z + model,
            "collapipe_no_ss": z + model,
            "titanic": z + model,
            "pipeline": z,
            "vanilla_fl": model + w.head_bytes,
        }[method]
    )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("policy", ["dssra", "random", "loss_only", "delay_only"])
def test_every_method_plan_satisfies_c1_to_c9(method, policy):
    for seed in range(3):
        pl, spec = planner(method, policy, clusters=1 + seed * 2, seed=seed)
        pl.Y[:] = [0.0, 0.5, 50.0][seed]
        sampler = StateSampler(spec, seed)
        for t in range(3):
            state = sampler.sample(t)
            plan = pl.plan(t, state)
            assert plan.modelled.method == method
            check_constraints(
                plan, spec, state, WORKLOAD, uplink_bits=bits_by_hand(method), with_d2d=method != "vanilla_fl"
            )
            assert len(plan.selected) == min(spec.num_clusters, spec.num_channels)
            pl.observe(plan, {c.cluster: 1.0 for c in plan.selected})


def test_vanilla_fl_trains_everything_on_the_best_device():
    pl, spec = planner("vanilla_fl", clusters=3)
    for t in range(4):
        state = StateSampler(spec, 0).sample(t)
        plan = pl.plan(t, state)
        for c in plan.clusters:
            speed = [
                d.f_hz * a * d.flops_per_cycle
                for d, a in zip(spec.devices_of(c.cluster), state.availability[c.cluster])
            ]
            best = int(np.argmax(speed))
            assert c.delta[best] == WORKLOAD.num_blocks and c.S == 1 and c.m == 1
            assert plan.modelled.clusters[c.cluster].d2d_s == 0.0


def test_pipeline_is_uniform_with_fixed_m():
    pl, spec = planner("pipeline", clusters=2)
    plan = pl.plan(0, StateSampler(spec, 0).sample(0))
    assert all(c.delta == (2, 2, 1) and c.m == conf("method", "pipeline")["fixed_m"] for c in plan.clusters)


def test_proportional_split_by_hand():
    # quotas 5 * (1, 1, 2) / 4 = 1.25, 1.25, 2.5 -> floors 1, 1, 2, the leftover block to the largest remainder
    assert proportional_split([1, 1, 2], [5, 5, 5], 5) == (1, 1, 3)
    # quotas 6 * (1, 2, 3) / 6 = 1, 2, 3 exactly
    assert proportional_split([1, 2, 3], [6, 6, 6], 6) == (1, 2, 3)
    # cap: quotas 2, 4 -> device 1 capped at 3, device 0 takes the rest
    assert proportional_split([1, 2], [6, 3], 6) == (3, 3)
    # weight 0 (not selected) gets nothing
    assert proportional_split([0, 1, 3], [6, 6, 6], 4) == (0, 1, 3)


def hand_model(caps, speeds, L=6) -> ClusterModel:
    K = len(caps)
    speeds = np.asarray(speeds, dtype=float)
    work = dict(cluster=0, num_blocks=L, batch_size=8, steps=1, flops_per_sample_block=1e8, activation_bits=1e3)
    devices = dict(flops_per_second=speeds, flops_per_cycle=np.full(K, 10.0), f_hz=speeds / 10.0)
    links = dict(d2d_rate=np.full(K, 1e9), d2d_power=np.full(K, 0.1))
    return ClusterModel(**work, **devices, **links, memory_cap=np.asarray(caps), energy_max=1e9, kappa=1e-28)


def test_titanic_splits_in_proportion_to_capability():
    # memory forces all three devices (any two hold at most 5 < 6 blocks); capability 1 : 2 : 3
    plan = titanic_segments(hand_model([2, 2, 3], [1e9, 2e9, 3e9]), 1.0, np.zeros(4), False)
    assert plan.delta == (1, 2, 3) and plan.m == 1 and plan.S == 3
    # with room on every device and m = 1, an extra device only adds a hand-over: one device, the fastest
    plan = titanic_segments(hand_model([6, 6, 6], [1e9, 2e9, 3e9]), 1.0, np.zeros(4), False)
    assert plan.delta == (0, 0, 6)
    # a device too small for the model is never chosen alone; the MILP picks the two fastest that fit
    plan = titanic_segments(hand_model([6, 3, 3], [1e9, 4e9, 4e9]), 1.0, np.zeros(4), False)
    assert plan.delta == (0, 3, 3)


def vanilla_delay_by_hand(spec, state, n: int) -> float:
    """The paper's VanillaFL: every device that holds all L blocks (C7) and trains them on its share
    ceil(b / D) within E_k^max (eq. 16, C9') trains in parallel; the slowest sets the round."""
    w = WORKLOAD
    L, flops = w.num_blocks, w.forward_flops[0] + w.backward_flops[0]
    devices = spec.devices_of(n)
    f = [d.f_hz * a for d, a in zip(devices, state.availability[n])]
    users = [k for k, d in enumerate(devices) if d.memory_bytes // w.block_memory_bytes() >= L and f[k] > 0]
    while True:
        share = math.ceil(w.batch_size / len(users))
        energy = {
            k: w.steps_per_round
            * spec.effective_capacitance
            * L
            * share
            * flops
            / devices[k].flops_per_cycle
            * f[k] ** 2
            for k in users
        }
        keep = [k for k in users if energy[k] <= spec.device_energy_max_j]
        if keep == users:
            break
        users = keep
    share = math.ceil(w.batch_size / len(users))
    chunk = [L * share * flops / (devices[k].flops_per_cycle * f[k]) + spec.per_microbatch_s for k in users]
    return w.steps_per_round * max(chunk)


def test_vanilla_fl_data_users_are_every_device_that_holds_the_model():
    pl, spec = planner("vanilla_fl", clusters=3)
    state = StateSampler(spec, 1).sample(1)
    plan = pl.plan(1, state)
    for c, row in zip(plan.clusters, plan.modelled.clusters):
        assert row.data_users == sum(
            d.memory_bytes // WORKLOAD.block_memory_bytes() >= WORKLOAD.num_blocks for d in spec.devices_of(c.cluster)
        )
        assert row.pipeline_s == pytest.approx(vanilla_delay_by_hand(spec, state, c.cluster), rel=1e-9)
        # the CU still executes the whole model on its fastest data user (delta = L there, S = m = 1)
        assert c.delta.count(WORKLOAD.num_blocks) == 1 and c.S == 1 and c.m == 1


def pipeline_delay_by_hand(spec, state, n: int, delta, m: int) -> float:
    """Eq. (15) as read: steps (S + m - 1) max_k (delta_k b_hat (o + o') / (phi_k f_k) + c0 + tau_k^dd)."""
    w, N0 = WORKLOAD, spec.noise_psd_w_hz
    b_hat = math.ceil(w.batch_size / m)
    chunks = []
    for k, dev in enumerate(spec.devices_of(n)):
        if delta[k] == 0:
            continue
        f = dev.f_hz * state.availability[n][k]
        comp = delta[k] * b_hat * (w.forward_flops[0] + w.backward_flops[0]) / (dev.flops_per_cycle * f)
        r_dd = spec.d2d_bandwidth_hz * math.log2(
            1 + dev.d2d_power_w * state.d2d_gain[n][k] / (spec.d2d_interference_w + spec.d2d_bandwidth_hz * N0)
        )
        d2d = b_hat * 2 * 8 * max(w.boundary_bytes) / r_dd + spec.d2d_latency_s
        chunks.append(comp + spec.per_microbatch_s + d2d)  # c0: per-micro-batch cost of a stage
    S = sum(1 for x in delta if x)
    return w.steps_per_round * (S + m - 1) * max(chunks)


def test_collapipe_without_ss_keeps_the_uniform_split_and_picks_the_best_m():
    """Only segment scheduling is removed: delta is uniform, m minimises eq. (15) over 1..b (queues empty in
    round 0, so Sub-1's objective is V tau^pipe), checked against every m by hand."""
    pl, spec = planner("collapipe_no_ss", clusters=3)
    state = StateSampler(spec, 2).sample(0)
    plan = pl.plan(0, state)
    for c in plan.clusters:
        assert c.delta == (2, 2, 1)
        by_m = {
            m: pipeline_delay_by_hand(spec, state, c.cluster, c.delta, m) for m in range(1, WORKLOAD.batch_size + 1)
        }
        assert by_m[c.m] == pytest.approx(min(by_m.values()), rel=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_modelled_delay_equals_the_formulas_by_hand(method):
    pl, spec = planner(method, clusters=3)
    state = StateSampler(spec, 3).sample(3)
    plan = pl.plan(3, state)
    N0 = spec.noise_psd_w_hz
    delays = []
    for c, row in zip(plan.clusters, plan.modelled.clusters):
        if method == "vanilla_fl":
            pipe = vanilla_delay_by_hand(spec, state, c.cluster)
            assert row.pipeline_s == pytest.approx(pipe, rel=1e-9) and row.d2d_s == 0.0
            delays += [pipe + row.uplink_s] if c.selected else []
            continue
        pipe = pipeline_delay_by_hand(spec, state, c.cluster, c.delta, c.m)  # eq. (15) as read
        assert row.pipeline_s == pytest.approx(pipe, rel=1e-9)
        if not c.selected:
            continue
        j = c.channel
        B, h, I = spec.channel_bandwidth_hz[j], state.uplink_gain[c.cluster][j], state.uplink_interference_w[j]
        uplink = bits_by_hand(method) / (B * math.log2(1 + c.power_w * h / (I + B * N0)))  # eqs. (10)-(11)
        assert row.uplink_s == pytest.approx(uplink, rel=1e-9)
        assert row.cu_energy_j == pytest.approx(c.power_w * uplink, rel=1e-9)  # eq. (12)
        delays.append(pipe + uplink)
    assert plan.modelled.round_delay_s == pytest.approx(max(delays), rel=1e-9)  # eq. (26)


def test_titanic_sends_at_the_largest_feasible_power():
    pl, spec = planner("titanic", clusters=2)
    state = StateSampler(spec, 0).sample(0)
    plan = pl.plan(0, state)
    for c in plan.selected:
        j = c.channel
        B, h, I = spec.channel_bandwidth_hz[j], state.uplink_gain[c.cluster][j], state.uplink_interference_w[j]

        def energy(p, B=B, h=h, I=I):
            return p * bits_by_hand("titanic") / (B * math.log2(1 + p * h / (I + B * spec.noise_psd_w_hz)))

        assert (
            c.power_w == pytest.approx(spec.cu_power_max_w, rel=1e-9)
            or energy(c.power_w * 1.001) > spec.cu_energy_max_j
        )


def test_vanilla_fl_names_c7_when_no_device_holds_the_model():
    net = conf("network", "small")
    net["device"]["memory_bytes"] = WORKLOAD.block_memory_bytes() * 3  # 3 of 5 blocks per device
    spec = NetworkSpec.from_config(net, 2)
    pl = make_planner(
        parse_method(conf("method", "vanilla_fl")), parse_scheduler(conf("scheduler", "dssra")), spec, WORKLOAD, 0
    )
    with pytest.raises(InfeasiblePlanError, match=r"C7 .*cluster 0"):
        pl.plan(0, StateSampler(spec, 0).sample(0))


def test_bad_method_config_is_one_line():
    with pytest.raises(ConfigError, match="method.zeta"):
        parse_method({"name": "collapipe", "zeta": 1})
    with pytest.raises(ConfigError, match="uploads nothing"):
        make_planner(
            parse_method({"name": "pipeline", "head_on_server": False, "aggregate": False}),
            parse_scheduler(conf("scheduler", "dssra")),
            NetworkSpec.from_config(conf("network", "small"), 1),
            WORKLOAD,
            0,
        )


def test_head_bytes_round_trip():
    assert Workload.from_dict(WORKLOAD.to_dict()) == WORKLOAD
    assert replace(WORKLOAD, head_bytes=0.0).head_bytes == 0.0
