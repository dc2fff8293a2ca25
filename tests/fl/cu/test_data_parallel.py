"""VanillaFL's data users on the CU (fl/cu/data_parallel.py) against an independent reference: D copies of the
plain model, each trained by hand with its own Adam on its rows of every batch, then averaged."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from collapipe_flwr import wiring
from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, train_round
from collapipe_flwr.fl.cu.data_parallel import user_share
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import unpack_weights
from collapipe_flwr.fl.server.server_state import ServerState


def _config(data_dir, *extra: str):
    return load_run_config(
        [
            "method=vanilla_fl",
            "task=classification",
            "model=bert_tiny",
            "model.dropout=0.0",
            "federation=tiny",
            "federation.local_steps=3",
            "network=small",
            "runtime.backend=local",
            "runtime.precision=fp32",
            "task.batch_size=8",
            "eval.max_examples=32",
            *extra,
        ],
        data_dir=str(data_dir),
    )


def _by_hand(cfg, task, before, cluster: int, users: int):
    """D plain models from the round's global parts, each its own Adam on rows tensor_split(b, D)[d] of the
    cluster's batches; their average weighted by the rows each trained on, and the per-step mean loss."""
    torch.manual_seed(0)
    plain = wiring.build_model(task, cfg)
    plain.embedding.load_state_dict(before["embedding"])
    plain.blocks.load_state_dict(before["encoder"])
    plain.head.load_state_dict(before["head"])
    examples = wiring.client_partition(task, cfg, cluster, cfg.federation.num_clusters)
    trained, rows = [], []
    for d in range(users):
        model = copy.deepcopy(plain)
        trains_embedding = cfg.federation.embedding == "trained"
        opt = wiring.optimizer_spec(cfg).build(
            [*(model.embedding.parameters() if trains_embedding else []), *model.blocks.parameters()]
            + [*model.head.parameters()]
        )
        n = 0
        batches = wiring.partition_batches(task, cfg, examples, seed=wiring.round_seed(cfg, 1, cluster))
        for batch in itertools.islice(batches, cfg.federation.local_steps):
            share = {k: torch.tensor_split(v, users)[d] for k, v in batch.items()}
            opt.zero_grad()
            loss_sum, count = model.loss_terms(share)
            (loss_sum / count).backward()
            opt.step()
            n += int(share["input_ids"].shape[0])
        trained.append(model)
        rows.append(n)
    expected = {}
    for part, attr in (("embedding", "embedding"), ("encoder", "blocks"), ("head", "head")):
        states = [getattr(m, attr).state_dict() for m in trained]
        expected[part] = {k: sum(s[k].double() * n for s, n in zip(states, rows)) / sum(rows) for k in states[0]}
    return expected, sum(rows)


@pytest.mark.e2e
@pytest.mark.parametrize("embedding", ["trained", "frozen"])
def test_vanilla_fl_round_is_d_users_trained_on_their_shares_and_averaged(data_dir, embedding):
    cfg = _config(data_dir, f"federation.embedding={embedding}")
    server = ServerState.build(cfg)
    try:
        before = server.global_model.parts()
        plan = server.planner.plan(1)
        cplan = plan.selected[0]
        users = cplan.data_users
        # network=small: every device holds bert_tiny, so all K = 3 are data users (ClusterModel.data_users)
        assert users == len(server.planner.devices_of(cplan.cluster)) == 3
        assert plan.modelled.clusters[cplan.cluster].data_users == users
        # one device per user, the first the one delta names
        assert sorted(cplan.user_devices) == [0, 1, 2]
        assert cplan.delta[cplan.user_devices[0]] == sum(cplan.delta)
        record, metrics = train_round(
            CUStateStore(),
            ClusterIdentity(cplan.cluster, cfg.federation.num_clusters, str(data_dir)),
            server.global_model.array_record(),
            server.instructions_for(1, cplan),
        )
        metrics = metrics.to_record()  # the report as it travels (RoundReport.to_record)
        task = server.task
    finally:
        server.shutdown()
    reply = unpack_weights(record)
    expected, rows = _by_hand(cfg, task, before, cplan.cluster, users)
    assert metrics["num-examples"] == rows
    # each user trained on its own device: every device computed and held the whole model once, and each user's
    # seconds are reported apart (the parallel round is the slowest user's)
    assert len(metrics["seconds-users"]) == users and all(s > 0 for s in metrics["seconds-users"])
    # each user's hand-over (its device loaded, its model read back) and the CU's average, measured apart: with
    # the users' steps they fit inside the round's training time, which also counts what the CU does around them
    handovers = metrics["seconds-users-handover"]
    assert len(handovers) == users and all(s > 0 for s in handovers) and metrics["seconds-users-average"] > 0
    parts = sum(metrics["seconds-users"]) + sum(handovers) + metrics["seconds-users-average"]
    assert parts <= metrics["seconds-train"]
    assert all(c > 0 for c in metrics["device-compute-seconds"])
    assert all(p > 0 for p in metrics["device-peak-bytes"])
    assert metrics["steps"] == cfg.federation.local_steps
    assert ("embedding" in reply) == (embedding == "trained")  # a frozen embedding is not uploaded (eq. 11)
    for part in reply:
        for name, value in expected[part].items():
            torch.testing.assert_close(reply[part][name].double(), value, rtol=1e-5, atol=1e-6)
    # the users' models differ from one model trained on the whole batch (the earlier single-device proxy)
    single, _ = _by_hand(cfg, task, before, cplan.cluster, 1)
    assert any(
        not torch.allclose(reply["encoder"][k].double(), single["encoder"][k], atol=1e-6) for k in single["encoder"]
    )


def test_plan_names_data_users_only_for_data_parallel_methods(data_dir):
    for method, expect_users in (("vanilla_fl", True), ("collapipe", False)):
        cfg = _config(data_dir, f"method={method}")
        server = ServerState.build(cfg)
        try:
            plan = server.planner.plan(1)
        finally:
            server.shutdown()
        for c in plan.selected:
            assert (c.data_users > 1) == expect_users
            assert ("data_users" in c.to_dict()) == expect_users  # pipelined plans' records are unchanged
            assert ClusterPlan.from_dict(c.to_dict()) == c


def test_plan_refuses_zero_data_users():
    with pytest.raises(ValueError, match="data_users=0"):
        ClusterPlan(cluster=0, selected=True, channel=0, power_w=0.1, S=1, m=1, delta=(2,), data_users=0)


@pytest.mark.parametrize(
    ("user_devices", "message"),
    [((0,), "1 user_devices for data_users=2"), ((0, 0), "distinct devices"), ((0, 3), "distinct devices in 0..2")],
)
def test_plan_refuses_user_devices_that_do_not_name_one_device_per_user(user_devices, message):
    plan = dict(cluster=0, selected=True, channel=0, power_w=0.1, S=1, m=1, delta=(2, 0, 0))
    with pytest.raises(ValueError, match=message):
        ClusterPlan(**plan, data_users=2, user_devices=user_devices)


def test_user_share_splits_rows_and_is_empty_past_a_short_batch():
    batch = {"input_ids": torch.arange(14).reshape(7, 2), "labels": torch.arange(7)}
    shares = [user_share(batch, d, 3) for d in range(3)]
    assert [s["labels"].tolist() for s in shares] == [[0, 1, 2], [3, 4], [5, 6]]
    short = {"input_ids": torch.zeros(2, 2), "labels": torch.zeros(2)}
    assert user_share(short, 2, 3) is None and user_share(short, 1, 3) is not None
