"""The server's side of the virtual clock: the round put together by hand (fl/server/virtual_round.py), each
cluster's rates from its model and the testbed (RoundPlanner.clock_for), the rates' trip in the train
instructions, and clock=virtual's refusals at start-up."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan, RoundPlan
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.fl.server.virtual_round import virtual_round
from collapipe_flwr.pipeline.virtual_clock import ClusterClock
from collapipe_flwr.system.profile import DeviceEmulation
from tests.fl.server.aggregation.test_reply_checks import GOOD


def _metrics(compute, d2d, cu, uplink, setup) -> RoundReport:
    return _report(
        {
            "virtual-compute-s": compute,
            "virtual-d2d-s": d2d,
            "virtual-cu-s": cu,
            "virtual-uplink-s": uplink,
            "virtual-setup-s": setup,
            "virtual-device-s": [compute, 0.0],
            "virtual-cluster-s": compute + d2d + cu + uplink + setup,
        }
    )


def _report(virtual: dict) -> RoundReport:
    """A CU's report (the hand-written reply of test_reply_checks) with these virtual-clock metrics."""
    return RoundReport.from_record({**{k: v for k, v in GOOD.items() if not k.startswith("virtual-")}, **virtual})


def test_the_round_is_the_slowest_cluster_with_its_decoder_plus_the_server():
    clients = {0: _metrics(10.0, 1.0, 0.5, 3.0, 2.0), 1: _metrics(9.0, 1.0, 0.5, 3.0, 2.0), 2: _report({})}
    # cluster 1's decoder work makes it the slowest: 15.5 + 4 = 19.5 against 16.5 + 1 = 17.5
    got = virtual_round(clients, {0: 1.0, 1: 4.0}, server_cpu_s=0.25)
    assert got["slowest"] == 1
    assert got["clusters"]["1"]["total_s"] == pytest.approx(19.5)
    assert got["round_s"] == pytest.approx(19.75)
    assert set(got["clusters"]) == {"0", "1"}  # a CU that sent no virtual clock is not a row
    assert virtual_round({0: _report({})}, {}, 1.0) == {}


def _planner(overrides):
    from collapipe_flwr.fl.server.server_state import build_planner
    from collapipe_flwr.system.workload import Workload

    cfg = load_run_config(overrides)
    workload = Workload.paper_preset(num_blocks=3, batch_size=8, seq_len=16, hidden=32)
    return build_planner(cfg, workload), workload


def test_a_clusters_rates_come_from_its_model_and_the_plans_uplink():
    planner, workload = _planner(["network=testbed", "federation.num_clusters=2"])
    plan = planner.plan(1)
    cluster = plan.selected[0]
    replan = plan.replan_inputs[cluster.cluster]
    clock = planner.clock_for(1, cluster, workload, 4e10, replan)
    model = replan.model
    assert clock.scale == pytest.approx(tuple(4e10 / np.asarray(model.flops_per_second)))
    assert clock.d2d_bytes_per_s == pytest.approx(tuple(np.asarray(model.d2d_rate) / 8))
    row = plan.modelled.clusters[cluster.cluster]
    assert clock.uplink_bytes_per_s == pytest.approx(plan.modelled.uplink_bits / 8 / row.uplink_s)
    assert planner.clock_for(1, cluster, workload, 0.0, replan) is None  # no host speed, no clock


def test_a_model_without_d2d_links_gives_hand_overs_no_time():
    # VanillaFL's cluster model has r_k^dd = inf (its users hand nothing on): the clock charges 0, not a refusal
    planner, workload = _planner(["network=testbed", "federation.num_clusters=2", "method=vanilla_fl"])
    plan = planner.plan(1)
    cluster = plan.selected[0]
    clock = planner.clock_for(1, cluster, workload, 4e10, plan.replan_inputs[cluster.cluster])
    assert clock.d2d_bytes_per_s == (0.0,) * len(clock.scale)
    assert clock.handover_s(0, 10_000) == 0.0


def test_on_the_testbed_a_device_runs_at_its_quota_and_its_links_at_their_buckets():
    planner, workload = _planner(["network=testbed", "federation.num_clusters=2"])
    plan = planner.plan(1)
    cluster = plan.selected[0]
    emulation = DeviceEmulation((0.5, 0.25, 0.0), (1e6, 2e6, 0.0), (0.002, 0.003, 0.0), 3e5)
    clock = planner.clock_for(1, cluster, workload, 4e10, plan.replan_inputs[cluster.cluster], emulation)
    model = plan.replan_inputs[cluster.cluster].model
    assert clock.scale[:2] == pytest.approx((2.0, 4.0))
    assert clock.scale[2] == pytest.approx(4e10 / model.flops_per_second[2])  # no quota: the model's speed
    assert clock.d2d_bytes_per_s[:2] == pytest.approx((1e6, 2e6))
    assert clock.d2d_latency_s[:2] == pytest.approx((0.004, 0.006))  # the buckets hold tau_0 / 2 per hand-over
    assert clock.uplink_bytes_per_s == pytest.approx(3e5)


def test_the_rates_travel_in_the_train_instructions():
    from collapipe_flwr.fl.messages import TrainInstructions

    cfg = load_run_config([])
    plan = ClusterPlan(0, True, 0, 0.1, 2, 2, (2, 1, 0, 0))
    clock = ClusterClock((1.0, 2.0, 3.0, 4.0), (1e6,) * 4, (0.005,) * 4, 2e5, 3e10)
    instructions = TrainInstructions(1, plan, cfg.cluster_config(), list(cfg.network.devices_of(0)), clock=clock)
    assert TrainInstructions.from_record(instructions.to_record()).clock == clock
    bare = dataclasses.replace(instructions, clock=None)
    assert TrainInstructions.from_record(bare.to_record()).clock is None
    assert RoundPlan(1, (plan,)).selected == (plan,)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["clock=virtual", "testbed=emulated"], "drop testbed=emulated"),
        (["clock=virtual", "runtime.emulate=true"], "drop testbed=emulated"),
        (["clock=virtual", "runtime.torch_threads=2"], "runtime.torch_threads=1"),
        (["clock.mode=sundial"], "clock.mode"),
        (["clock.host_flops=-1"], "clock.host_flops"),
    ],
)
def test_a_clock_that_cannot_be_kept_is_refused_at_start_up(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_run_config(overrides)
    assert load_run_config(["clock=virtual"]).clock.virtual
