"""A device lost while the round's plan leaves it idle (issue 67): it takes no part in the steps, so its CU's round
stands; the device is lost as any other (``lost-devices``) and never given blocks again.

Real Ray device actors, killed with ``ray.kill`` as a dead device process: the pipeline on its own (the dead idle
device left out of the devices' processes, a dead device holding blocks still a DeviceFailure), then a CU's two
rounds with the plan of the finding, delta = (0, 3, 0), and device 2 killed during round 1's steps."""

from __future__ import annotations

import dataclasses
import math

import pytest
from flwr.app import RecordDict

from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, release_run, run_key_of, train_round
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import unpack_weights
from collapipe_flwr.fl.server.server_state import ServerState
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from tests.fold_replies import absorb_replies
from tests.pipeline.executors.test_pipeline_ray import ADAM, batch, profile, tiny
from tests.runtimes import runtime

pytestmark = pytest.mark.e2e

STEPS = 3


def test_a_dead_idle_device_is_left_out_and_lost_and_a_dead_device_holding_blocks_still_fails(ray_session):
    model = tiny(layers=3)
    rt = runtime(backend="ray", actor_threads=1, prestart_devices=True)
    with ClusterPipeline(model.embedding, model.blocks, (0, 3, 0), ADAM, [profile(1.0)] * 3, runtime=rt) as pipe:
        head = LocalHead(model.head, ADAM)
        assert sorted(pipe.stages.processes()) == [0, 1, 2]  # devices 0 and 2 alive, idle
        ray_session.kill(pipe.stages.devices[2], no_restart=True)
        assert math.isfinite(pipe.train_step(batch(), 2, head).loss)  # device 2 takes no part in the step
        assert sorted(pipe.stages.processes()) == [0, 1]  # before the fix: DeviceFailure "device 2 gave no answer"
        losses = pipe.take_idle_losses()
        assert [f.device for f in losses] == [2] and "device 2" in str(losses[0])
        assert pipe.lost_devices == (2,) and pipe.take_idle_losses() == []  # taken once
        assert sorted(pipe.stages.processes()) == [0, 1]  # forgotten: not asked again
        ray_session.kill(pipe.stages.devices[1], no_restart=True)
        with pytest.raises(DeviceFailure) as failure:  # device 1 holds every block: its loss fails as before
            pipe.stages.processes()
        assert failure.value.device == 1 and pipe.take_idle_losses() == []


def _plan(delta, m=2) -> ClusterPlan:
    return ClusterPlan(
        cluster=0, selected=True, channel=0, power_w=0.1, S=sum(1 for d in delta if d), m=m, delta=tuple(delta)
    )


def test_a_cu_whose_idle_device_dies_mid_round_finishes_the_round_and_never_gives_it_blocks(
    data_dir, ray_session, monkeypatch
):
    overrides = ["task=translation", "model=transformer_tiny", "model.enc_layers=3", "federation=tiny"]
    overrides += ["network=small", "federation.num_clusters=1", f"federation.local_steps={STEPS}"]
    overrides += ["runtime.backend=ray", "runtime.prestart_devices=true", "task.batch_size=8", "runtime.precision=fp32"]
    cfg = load_run_config(overrides, data_dir=str(data_dir))
    real_step = ClusterPipeline.train_step
    calls = []

    def step(self, *args, **kwargs):
        calls.append(self.placement.delta)
        if len(calls) == 2:  # round 1, mid-round: the device the plan leaves idle dies
            ray_session.kill(self.stages.devices[2], no_restart=True)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(ClusterPipeline, "train_step", step)
    server = ServerState.build(cfg)
    identity = ClusterIdentity(0, 1, str(data_dir))
    store = CUStateStore()  # both rounds in one CU process
    reports = []
    try:
        weights = server.global_model.array_record()
        # round 2's plan gives device 2 blocks (the server does not know it is gone): the CU re-plans over 0 and 1
        for t, delta in ((1, (0, 3, 0)), (2, (1, 1, 1))):
            inputs = server.planner.plan(t).replan_inputs[0]  # Sub-1's inputs for the CU's re-plans
            instructions = dataclasses.replace(server.instructions_for(t, _plan(delta)), replan=inputs)
            server.decoder.open_round(t, [0])
            record, report = train_round(store, identity, weights, instructions, state=RecordDict())
            server.decoder.close_round()
            reports.append(report.to_record())
            absorb_replies(server, t, [(0, unpack_weights(record), reports[-1])])
            weights = server.global_model.array_record()
    finally:
        release_run(store, identity, run_key_of(cfg.cluster_config().with_data_dir(str(data_dir)), None), 3)
        server.shutdown()
    first, second = reports
    assert first["steps"] == STEPS and all(math.isfinite(x) for x in first["train-losses"])  # the whole round
    assert first["lost-devices"] == [2] and first["lost-for-memory"] == []
    assert first["replanned-delta"] == [0, 3, 0] and first["replanned-m"] == 2  # the plan it ran, unchanged
    assert 2 not in [k for k, d in enumerate(calls[STEPS]) if d]  # round 2 never put blocks on device 2
    assert second["steps"] == STEPS and all(math.isfinite(x) for x in second["train-losses"])
    assert second["lost-devices"] == [2] and second["replanned-delta"][2] == 0
    assert sum(second["replanned-delta"]) == 3  # every block on devices 0 and 1
    assert len(second["device-pids"]) == 2  # devices 0 and 1: no actor started again for device 2
