"""runtime.seeded_dropout: dropout masks from (seed, round, cluster, step, micro-batch, block), whatever the split.

The reference is the plain model run by hand, one micro-batch at a time, with torch seeded before the embedding
and before each block exactly as pipeline/dropout_seed.py says: every split S (on the in-process backend and on
Ray actors, each a process of its own) must give its loss and every gradient. Without the seed the same
comparison fails, so the check is not vacuous. The server's head: the same step id gives the same reply, however
often and in whatever process it is served.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.client import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.server.decoder.host import DecoderHost, DecoderHostSpec
from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.dropout_seed import EMBEDDING, block_seed, seed_block, step_seed
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.optim import OptimizerSpec
from tests.fl.server.decoder.test_decoder_update import H, _micro_batch
from tests.runtimes import runtime

L, B, T, M = 4, 4, 6, 2
DELTAS = {1: (4,), 2: (1, 3), 3: (2, 0, 2)}
SGD_UNIT = OptimizerSpec(name="sgd", lr=1.0)  # w_before - w_after = the gradient the pipeline applied
STEP = step_seed(7, round_=3, cluster=1, step=5)


def make_model():
    torch.manual_seed(0)
    model = build_bert(
        BertSplitConfig(
            vocab_size=29, hidden=16, n_heads=2, d_ff=32, layers=L, dropout=0.4, max_len=16, head="token", num_labels=5
        )
    )
    model.head.dropout.p = 0.0  # the CU-side head here: its masks are the server's concern (test below)
    for part in model.parts():
        part.double()
    return model


def make_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 29, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 5, (B, T), generator=g)}


def reference_grads(model, batch) -> dict[str, torch.Tensor]:
    """The plain model, micro-batch by micro-batch (rows split as the pipeline splits them: equal halves), torch
    seeded before the embedding and before each block l with block_seed(STEP, i, l); loss = sum / count."""
    model = copy.deepcopy(model).train()
    total, count = 0.0, 0
    for i, rows in enumerate((slice(0, B // M), slice(B // M, B))):
        mb = {k: v[rows] for k, v in batch.items()}
        torch.manual_seed(block_seed(STEP, i, EMBEDDING))
        hidden = model.embedding(mb["input_ids"])
        for l, block in enumerate(model.blocks):
            torch.manual_seed(block_seed(STEP, i, l))
            hidden = block(hidden, mb["attention_mask"])
        s, c = model.head.loss_terms(hidden, mb["attention_mask"], mb)
        total, count = total + s, count + int(c)
    (total / count).backward()
    grads = {f"embedding.{k}": p.grad.clone() for k, p in model.embedding.named_parameters()}
    grads.update({f"blocks.{k}": p.grad.clone() for k, p in model.blocks.named_parameters()})
    return grads


def pipelined_grads(model, batch, delta, backend: str, seed: int | None) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model)
    with ClusterPipeline(model.embedding, model.blocks, delta, SGD_UNIT, runtime=runtime(backend=backend)) as pipe:
        emb_before = {k: v.detach().clone() for k, v in model.embedding.named_parameters()}
        enc_before = pipe.encoder_state_dict()
        pipe.train_step(batch, M, LocalHead(model.head, SGD_UNIT), step_seed=seed)
        enc_after = pipe.encoder_state_dict()
    grads = {f"embedding.{k}": emb_before[k] - v.detach() for k, v in model.embedding.named_parameters()}
    grads.update({f"blocks.{k}": enc_before[k] - enc_after[k] for k in enc_before})
    return grads


def assert_same(grads, ref) -> None:
    assert set(grads) == set(ref)
    for name, g in ref.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-10, msg=lambda s, n=name: f"grad of {n}: {s}")


def test_seeds_depend_on_every_coordinate_and_an_unseeded_step_leaves_torch_alone():
    seeds = {block_seed(step_seed(s, t, n, j), i, l) for s in (0, 1) for t in (1, 2) for n in (0, 1) for j in (0, 1)
             for i in (0, 1) for l in (EMBEDDING, 0, 1)}  # fmt: skip
    assert len(seeds) == 2**4 * 2 * 3 and all(0 <= x < 2**63 for x in seeds)
    assert step_seed(7, 3, 1, 5) == STEP  # a pure function: the same on every machine and process
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    seed_block(None, 0, 0)
    torch.testing.assert_close(torch.rand(3), expected)


@pytest.mark.parametrize("S", [1, 2, 3])
def test_every_split_draws_the_plain_models_masks(S):
    model, batch = make_model(), make_batch()
    assert_same(pipelined_grads(model, batch, DELTAS[S], "local", STEP), reference_grads(model, batch))


def test_without_the_seed_the_masks_differ_so_the_check_can_fail():
    model, batch = make_model(), make_batch()
    torch.manual_seed(99)
    with pytest.raises(AssertionError):
        assert_same(pipelined_grads(model, batch, DELTAS[2], "local", None), reference_grads(model, batch))


@pytest.mark.e2e
def test_ray_device_actors_draw_the_same_masks_in_their_own_processes(ray_session):
    model, batch = make_model(), make_batch()
    assert_same(pipelined_grads(model, batch, DELTAS[2], "ray", STEP), reference_grads(model, batch))


class DropoutHead(nn.Module):
    """A token classifier with dropout 0.5 before its projection: its reply depends on the masks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.drop, self.proj = nn.Dropout(0.5), nn.Linear(H, 3)

    def loss_terms(self, z, attention_mask, mb):
        logits = self.proj(self.drop(z))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 3), mb["labels"].reshape(-1), reduction="sum")
        return loss, int(mb["labels"].numel())


def served_grads(dropout_seed: int | None, rng_before: int) -> torch.Tensor:
    """dL/dz_enc of one step (round 1, cluster 0, step id 1) through a fresh host whose head takes no optimizer
    step (lr 0), the process's torch generator set to ``rng_before`` first."""
    head = DropoutHead()
    spec = DecoderHostSpec(hidden_size=H, bind="127.0.0.1", dropout_seed=dropout_seed)
    host = DecoderHost(head, torch.optim.SGD(head.parameters(), lr=0.0), "s", spec)
    with host:
        host.open_round(1, [0])
        z, mb = _micro_batch(5, 2, 5)
        torch.manual_seed(rng_before)
        spec = DecoderClientSpec(timeout_s=30)
        with DecoderClient(host.address, cluster_key("s", 1, 0), round=1, cluster=0, spec=spec) as client:
            _, grads = client([z], [mb])
        host.close_round()
    return grads[0]


def test_the_server_heads_masks_follow_the_step_not_the_servers_generator():
    torch.testing.assert_close(served_grads(7, rng_before=1), served_grads(7, rng_before=2))
    with pytest.raises(AssertionError):  # unseeded: the server's own generator decides
        torch.testing.assert_close(served_grads(None, rng_before=1), served_grads(None, rng_before=2))
