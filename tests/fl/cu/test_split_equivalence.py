"""The split adds no error: one CU, one round, the real CU code path (embedding on the CU, pipeline,
z_enc to the server's decoder over the gRPC data plane and gradients back) reproduces plain
single-process training of the whole model step for step."""

from __future__ import annotations

import copy
import itertools

import pytest

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, train_round
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.server.server_state import ServerState
from tests.plain_reference import plain_losses

pytestmark = pytest.mark.e2e

STEPS = 5
_RUN_IDS = itertools.count(9100)  # a fresh run per case: a CU session (and its optimizer moments) never carries over


def _config(data_dir, task: str, model: str):
    overrides = [
        f"task={task}",
        f"model={model}",
        "federation=tiny",
        "network=small",
        "federation.num_clusters=1",
        f"federation.local_steps={STEPS}",
        "runtime.backend=local",
        "task.batch_size=8",
        "model.dropout=0.0",
        "runtime.precision=fp32",
    ]
    return load_run_config(overrides, data_dir=str(data_dir))


@pytest.mark.parametrize(
    "task,model,S,m",
    [
        ("translation", "transformer_tiny", 1, 1),
        ("classification", "bert_tiny", 1, 1),
        ("translation", "transformer_tiny", 2, 2),
    ],
)
def test_split_training_reproduces_plain_training(data_dir, task, model, S, m):
    cfg = _config(data_dir, task, model)
    server = ServerState.build(cfg)
    try:
        L = len(server.model.blocks)
        K = len(server.planner.devices_of(0))
        delta = [0] * K
        if S == 1:
            delta[0] = L
        else:
            delta[0], delta[-1] = L // 2, L - L // 2
        plan = ClusterPlan(cluster=0, selected=True, channel=0, power_w=0.1, S=S, m=m, delta=tuple(delta))
        server.decoder.open_round(1, [0])
        instructions = server.instructions_for(1, plan)
        _, metrics = train_round(
            CUStateStore(),
            ClusterIdentity(0, 1, str(data_dir)),
            copy.deepcopy(server.global_model.array_record()),
            instructions,
            run_id=next(_RUN_IDS),  # without it the run is named by its config, which another test may share
        )
        metrics = metrics.to_record()  # the report as it travels (RoundReport.to_record)
        server.decoder.close_round()
    finally:
        server.shutdown()
    task_obj = wiring.build_task(cfg)
    indices = wiring.client_partition(task_obj, cfg, 0, 1)
    expected = plain_losses(cfg, task_obj, indices)
    assert len(metrics["train-losses"]) == STEPS
    assert metrics["train-losses"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert expected[-1] < expected[0]  # training happened, so the comparison is not vacuous
