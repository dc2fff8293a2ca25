"""One round of each baseline through the real server and CU code (no Flower processes): the plan
shape each method promises, what travels, and how the server folds the results in."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.config import build_cluster_config, load_run_config
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, train_round
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import unpack_weights
from collapipe_flwr.fl.server.server_state import ServerState
from tests.fold_replies import absorb_replies

pytestmark = pytest.mark.e2e


def _one_round(data_dir, method: str, *extra: str):
    cfg = load_run_config(
        [
            *extra,
            f"method={method}",
            "task=classification",
            "model=bert_tiny",
            "federation=tiny",
            "network=small",
            "federation.local_steps=2",
            "runtime.backend=local",
            "task.batch_size=8",
            "eval.max_examples=32",
        ],
        data_dir=str(data_dir),
    )
    server = ServerState.build(cfg)
    before = server.global_model.parts()
    plan = server.planner.plan(1)
    selected = [c.cluster for c in plan.selected]
    server.decoder.open_round(1, selected)
    results = []
    store = CUStateStore()  # one CU process serves the clusters, as a worker of Flower's simulation
    try:
        for cplan in plan.selected:
            instructions = server.instructions_for(1, cplan)
            record, metrics = train_round(
                store,
                ClusterIdentity(cplan.cluster, cfg.federation.num_clusters, str(data_dir)),
                server.global_model.array_record() if method != "pipeline" else _record(server, cplan.cluster),
                instructions,
            )
            metrics = metrics.to_record()  # the report as it travels (RoundReport.to_record)
            results.append((cplan.cluster, unpack_weights(record), metrics))
        server.decoder.close_round()
        absorb_replies(server, 1, results)
        scores = server.evaluate()
    finally:
        server.shutdown()
    return cfg, server, plan, before, results, scores


def _record(server, cluster):
    from collapipe_flwr.fl.messages import pack_weights

    return pack_weights(server.global_model.for_cluster(cluster))


def test_vanilla_fl_trains_whole_model_on_one_device_and_averages_the_head(data_dir):
    cfg, server, plan, before, results, scores = _one_round(data_dir, "vanilla_fl")
    L = len(server.model.blocks)
    for c in plan.selected:
        assert c.S == 1 and c.m == 1 and sorted(c.delta)[-1] == L
    assert server.decoder.host is None  # no data plane: the head trains on the CU
    assert all("head" in parts for _, parts, _ in results)
    n = [m["num-examples"] for _, _, m in results]
    after = server.global_model.parts()
    for name, value in after["head"].items():
        expected = sum(p["head"][name].double() * w for (_, p, _), w in zip(results, n)) / sum(n)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(after["head"][k], before["head"][k]) for k in before["head"])
    assert "accuracy" in scores


def test_pipeline_keeps_one_encoder_per_cluster_and_reports_their_mean(data_dir):
    cfg, server, plan, before, results, scores = _one_round(data_dir, "pipeline")
    K = len(server.planner.devices_of(0))
    L = len(server.model.blocks)
    for c in plan.selected:
        assert max(c.delta) - min(d for d in c.delta) <= 1 and sum(c.delta) == L and c.S == min(K, L)
    # the global encoder is untouched; each cluster's own encoder is what it returned
    after = server.global_model.parts()
    assert all(torch.equal(after["encoder"][k], before["encoder"][k]) for k in before["encoder"])
    for cluster, parts, _ in results:
        kept = server.global_model.for_cluster(cluster)
        assert all(torch.equal(kept["encoder"][k], parts["encoder"][k]) for k in parts["encoder"])
    # no FedAvg, so no model upload (eq. 11 charges PipeLine z_enc only): the weights travel back for evaluation,
    # counted apart, and the CU was told so by the config it received (no emulated uplink for them)
    assert cfg.cluster_config().aggregated is False
    assert build_cluster_config(cfg.cluster_config().to_dict()).aggregated is False
    for _cluster, parts, metrics in results:
        carried = sum(t.numel() * t.element_size() for part in parts.values() for t in part.values())
        assert metrics["upload-bytes"] == 0 and metrics["carried-bytes"] == carried > 0
    # the reported score is the mean over the clusters' models (recomputed here one by one)
    import copy

    per_cluster = []
    for _cluster, parts, _ in results:
        model = copy.copy(server.model)
        model.embedding = copy.deepcopy(server.model.embedding)
        model.blocks = copy.deepcopy(server.model.blocks)
        model.embedding.load_state_dict(parts["embedding"])
        model.blocks.load_state_dict(parts["encoder"])
        for mod in (model.embedding, model.blocks, model.head):
            mod.eval()
        with torch.no_grad():
            per_cluster.append(server.task.evaluate(model, max_examples=32, batch_size=cfg.eval.batch_size)["accuracy"])
    assert scores["accuracy"] == pytest.approx(sum(per_cluster) / len(per_cluster))


def test_titanic_runs_one_micro_batch_at_full_power(data_dir):
    cfg, server, plan, before, results, scores = _one_round(data_dir, "titanic")
    for c in plan.selected:
        assert c.m == 1
    assert results and all(m["steps"] == 2 for _, _, m in results)
    assert "accuracy" in scores


@pytest.mark.parametrize("method", ["collapipe", "pipeline"])
def test_a_frozen_embedding_is_neither_trained_nor_uploaded(data_dir, method):
    """federation.embedding=frozen: the CUs return only the encoder (eq. 11: z_enc + theta_enc), the global
    embedding keeps its initial values, the encoder still trains, and the modelled uplink drops exactly the
    embedding's bytes (counted by hand on the model)."""
    cfg, server, plan, before, results, scores = _one_round(data_dir, method, "federation.embedding=frozen")
    assert results and all(set(parts) == {"encoder"} for _, parts, _ in results)
    for name, value in server.model.embedding.state_dict().items():
        assert torch.equal(value, before["embedding"][name])
    changed = [n for n, v in server.model.blocks.state_dict().items() if not torch.equal(v, before["encoder"][n])]
    assert changed or method == "pipeline"  # pipeline keeps each cluster's encoder apart from the global one
    assert server.workload.extra_upload_bytes == 0.0
    trained = ServerState.build(
        load_run_config(
            ["task=classification", "model=bert_tiny", "federation=tiny", "network=small", "task.batch_size=8"],
            data_dir=str(data_dir),
        )
    )
    try:
        embedding_bytes = sum(p.numel() * p.element_size() for p in trained.model.embedding.parameters())
        assert trained.workload.extra_upload_bytes == embedding_bytes
    finally:
        trained.shutdown()
    assert "accuracy" in scores
