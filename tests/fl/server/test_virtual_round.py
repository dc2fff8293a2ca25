"""The server's side of the virtual clock: the round put together by hand (fl/server/virtual_round.py), each
cluster's rates from its model and the testbed (RoundPlanner.clock_for), the rates' trip in the train
instructions, a round that reads the same on a host 4x slower once the server's and the CUs' own work are set
against their speeds (clock.server_flops, clock.cu_flops), and clock=virtual's refusals at start-up."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan, RoundPlan
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.cu.round_metrics import virtual_figures
from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.fl.server.virtual_round import virtual_round
from collapipe_flwr.pipeline.timings import CallCpu
from collapipe_flwr.pipeline.virtual_clock import ClusterClock, StepCalls
from collapipe_flwr.system.clock_spec import ClockSpec
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


def test_the_servers_work_is_set_against_the_edge_servers_speed():
    clients = {0: _metrics(10.0, 1.0, 0.5, 3.0, 2.0), 1: _metrics(9.0, 1.0, 0.5, 3.0, 2.0)}
    # the server's thread is 2x slower than the host's: its decoder's 1 and 4 CPU seconds take 2 and 8, its 0.25 0.5
    got = virtual_round(clients, {0: 1.0, 1: 4.0}, server_cpu_s=0.25, server_scale=2.0, host_flops=8e10)
    assert got["clusters"]["0"]["total_s"] == pytest.approx(16.5 + 2.0)
    assert got["clusters"]["1"]["total_s"] == pytest.approx(15.5 + 8.0)
    assert got["round_s"] == pytest.approx(23.5 + 0.5)
    assert (got["server_scale"], got["host_flops"]) == (2.0, 8e10)
    with pytest.raises(ValueError, match="server_scale"):
        virtual_round(clients, {}, 0.25, server_scale=0.0)


# one cluster's round as a host measures it: two devices of 1e10 FLOP/s, ten steps; a host ``slowdown`` times slower
# than the reference host (8e10 FLOP/s per thread) measures every CPU second of the same work ``slowdown`` times longer
REFERENCE_FLOPS, DEVICE_FLOPS = 8e10, 1e10
OWN_WORK = {"cu": 0.003 * 10, "setup": 0.5, "decoder": 0.8, "server": 0.1}  # the reference host's seconds


def _round_on(host_flops: float, spec: ClockSpec) -> float:
    slowdown = REFERENCE_FLOPS / host_flops
    cu_scale = spec.own_work_scale(host_flops, "cu")
    clock = ClusterClock((host_flops / DEVICE_FLOPS,) * 2, (1e6,) * 2, (0.004,) * 2, 2e5, host_flops, cu_scale)
    calls = tuple(CallCpu(kind, i, cpu * slowdown, 4096) for kind, i, cpu in (("F", 0, 0.01), ("B", 0, 0.02)))
    step = StepCalls(((0, calls), (1, calls)), cu_cpu_s=0.003 * slowdown)
    steps = StepLog([], 0, {}, [], calls=[step] * 10)
    figures = virtual_figures(steps, clock, "gpipe", True, OWN_WORK["setup"] * slowdown, 10_000)
    report = dataclasses.replace(_report({}), virtual=figures)
    decoder = {0: OWN_WORK["decoder"] * slowdown}
    scale = spec.own_work_scale(host_flops, "server")
    return virtual_round({0: report}, decoder, OWN_WORK["server"] * slowdown, scale, host_flops)["round_s"]


def test_a_round_reads_the_same_on_a_slower_host_once_the_server_and_cus_have_speeds():
    speeds = ClockSpec(server_flops=4e10, cu_flops=2e10)
    assert _round_on(REFERENCE_FLOPS / 4, speeds) == pytest.approx(_round_on(REFERENCE_FLOPS, speeds))
    # against the host's own seconds: the server's work at 2x them, the CU's at 4x, by hand
    own = sum(OWN_WORK.values())
    scaled = 4 * (OWN_WORK["cu"] + OWN_WORK["setup"]) + 2 * (OWN_WORK["decoder"] + OWN_WORK["server"])
    assert _round_on(REFERENCE_FLOPS, speeds) - _round_on(REFERENCE_FLOPS, ClockSpec()) == pytest.approx(scaled - own)
    # left at the host's own seconds, the 4x slower host adds 3x that work to the round: the record depends on it
    slower = _round_on(REFERENCE_FLOPS / 4, ClockSpec()) - _round_on(REFERENCE_FLOPS, ClockSpec())
    assert slower == pytest.approx(3 * own)


def test_the_emulated_testbed_keeps_the_servers_and_cus_own_seconds():
    from collapipe_flwr.fl.server.server_state import ServerState

    speeds = ["clock.server_flops=4e10", "clock.cu_flops=2e10"]
    host = SimpleNamespace(cfg=load_run_config(speeds), host_flops=8e10)
    assert (ServerState.own_work_scale(host, "server"), ServerState.own_work_scale(host, "cu")) == (2.0, 4.0)
    testbed = SimpleNamespace(cfg=load_run_config([*speeds, "testbed=emulated"]), host_flops=8e10)
    assert ServerState.own_work_scale(testbed, "server") == ServerState.own_work_scale(testbed, "cu") == 1.0


class _Readings:
    """A probe whose readings are given: the host's speed as a run would read it, one value per call."""

    def __init__(self, *values):
        self.values = list(values)

    def host_flops(self, cfg):
        return self.values.pop(0)


def _reading_server(overrides, start, *later):
    from collapipe_flwr.fl.server.server_state import ServerState

    host = SimpleNamespace(cfg=load_run_config(overrides), host_flops=start, host_readings=[start])
    host.probe = _Readings(*later)
    return host, lambda: ServerState.read_host_speed(host)


def test_a_round_reads_the_host_again_and_sets_its_devices_against_the_median_so_far():
    """A start-up outlier (21.1e9 against 26e9) moves the rounds' speed only while it is not outvoted: the median
    of [21.1], then [21.1, 26.0], then [21.1, 26.0, 25.6] (by hand: 23.55e9, then 25.6e9)."""
    host, read = _reading_server(["clock=virtual"], 21.1e9, 26.0e9, 25.6e9, 26.3e9)
    assert read() == 26.0e9 and host.host_flops == pytest.approx(23.55e9)
    assert read() == 25.6e9 and host.host_flops == 25.6e9
    assert read() == 26.3e9 and host.host_flops == pytest.approx(25.8e9)
    assert host.host_readings == [21.1e9, 26.0e9, 25.6e9, 26.3e9]


@pytest.mark.parametrize(
    "overrides",
    [["clock=wall"], ["clock=virtual", "clock.probe_every_round=false"], ["testbed=emulated"]],
)
def test_no_reading_is_taken_where_the_option_is_off_or_the_testbed_sets_the_scales(overrides):
    host, read = _reading_server(overrides, 21.1e9, 26.0e9)
    assert read() is None and host.host_flops == 21.1e9 and host.host_readings == [21.1e9]


def test_a_configured_host_speed_is_never_read_again():
    host, read = _reading_server(["clock=virtual", "clock.host_flops=5e10"], 5e10)
    host.probe = None  # ServerState.build keeps no probe when clock.host_flops is given
    assert read() is None and host.host_flops == 5e10


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
        # a GPU call's thread CPU seconds are not its work (benchmarks/gpu_machine/thread_time_on_cuda.py)
        (["clock=virtual", "runtime.device=cuda"], "runtime.device=cpu"),
        (["clock=virtual", "runtime.device=auto"], "runtime.device=cpu"),
        (["clock=virtual", "runtime.server_device=cuda"], "runtime.server_device=cpu"),
        (["clock=virtual", "runtime.device=cuda", "runtime.server_device=cpu"], "runtime.device=cpu"),
        (["clock.mode=sundial"], "clock.mode"),
        (["clock.host_flops=-1"], "clock.host_flops"),
        (["clock.server_flops=-1"], "clock.server_flops"),
        (["clock.cu_flops=inf"], "clock.cu_flops"),
    ],
)
def test_a_clock_that_cannot_be_kept_is_refused_at_start_up(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_run_config(overrides)
    assert load_run_config(["clock=virtual"]).clock.virtual
    assert load_run_config(["clock=virtual", "runtime.device=cpu", "runtime.server_device=cpu"]).clock.virtual
    assert load_run_config(["runtime.device=cuda"]).runtime.device == "cuda"  # the wall clock times a GPU run


@pytest.mark.e2e
def test_a_virtual_run_records_each_rounds_reading_and_the_median_it_used(data_dir, tmp_path):
    """Two rounds of a tiny virtual-clock run (whole server, real CU handlers, in process): each round records its
    reading (``host_reading``) and the speed its devices were set against (``host_flops``). Round 1's is the median
    of the start-up reading and its own, their mean, which gives the start-up reading back; round 2's must be the
    middle of the three, by hand."""
    from collapipe_flwr.fl.server.server_main import run_server
    from tests.inprocess_grid import InProcessGrid

    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
        "federation.local_steps=1 runtime.backend=local runtime.precision=fp32 task.batch_size=8 "
        "eval.max_examples=8 clock=virtual run_name=reprobe"
    )
    run_config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    first, second = (r["virtual"] for r in rounds if r.get("round", 0) >= 1)
    start = 2 * first["host_flops"] - first["host_reading"]
    assert start > 0
    middle = sorted([start, first["host_reading"], second["host_reading"]])[1]
    assert second["host_flops"] == pytest.approx(middle, rel=1e-9)
