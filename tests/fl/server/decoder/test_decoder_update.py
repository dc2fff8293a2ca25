"""The server decoder's update modes and its guard against poisoned steps.

- ``joint`` (Algorithm 1, line 14): step seq of every cluster is gathered and ONE head update runs on the
  concatenation; each CU gets the gradients of its own mean loss. Reference: the plain head trained by hand
  on the concatenated micro-batches (one Adam step per seq), and per-cluster losses and gradients computed
  by hand from the same head.
- a cluster that never reaches the barrier is left out after the timeout; the others go on.
- a step whose loss or gradients are not finite is refused and leaves the head and its optimizer untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.backend import TRANSPORTS
from collapipe_flwr.fl.dataplane.client import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.server.decoder.host import DecoderHost, DecoderHostSpec
from collapipe_flwr.fl.server.decoder.joint import JointSteps
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import run_cus_then_stop

H, T, CLASSES = 8, 5, 3


def adam_host(head: nn.Module, **options) -> DecoderHost:
    """A loopback DecoderHost training ``head`` with Adam (lr 0.01) under the key "s": these tests' common host
    (``options``: its DecoderHostSpec's other settings)."""
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    return DecoderHost(head, optimizer, "s", DecoderHostSpec(hidden_size=H, bind="127.0.0.1", **options))


class TokenHead(nn.Module):
    """A linear token classifier: loss_terms = (sum of token cross-entropies, number of labelled tokens)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(H, CLASSES)

    def loss_terms(self, z, attention_mask, mb):
        logits = self.proj(z)
        labels = mb["labels"]
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss, int((labels != -100).sum())


def _micro_batch(seed: int, b: int, labelled: int):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(b, T, H, generator=g)
    labels = torch.randint(0, CLASSES, (b, T), generator=g)
    labels[:, labelled:] = -100  # clusters differ in how many targets they have: the rescaling matters
    return z, {"attention_mask": torch.ones(b, T, dtype=torch.long), "labels": labels}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_joint_update_equals_one_step_on_all_clusters(tmp_path, transport):
    torch.manual_seed(0)
    head = TokenHead()
    reference = copy.deepcopy(head)
    host = adam_host(head, decoder_update="joint", transport=transport)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    host.start()
    host.open_round(1, [0, 1])
    data = {
        c: [[_micro_batch(100 * c + 10 * s + i, 2 + c, 2 + 2 * c) for i in range(2)] for s in range(3)] for c in (0, 1)
    }
    answers: dict[int, list] = {0: [], 1: []}

    def cu(c: int) -> None:
        spec = DecoderClientSpec(timeout_s=30, transport=transport)
        client = DecoderClient(host.address, cluster_key("s", 1, c), round=1, cluster=c, spec=spec)
        try:
            for step in data[c]:
                answers[c].append(client([z for z, _ in step], [mb for _, mb in step]))
        finally:
            client.close()

    run_cus_then_stop(host, cu, [(0,), (1,)], 60)
    for s in range(3):
        # the reference: one Adam step of the plain head on both clusters' micro-batches (mean over all targets)
        zs = [z.clone().requires_grad_(True) for c in (0, 1) for z, _ in data[c][s]]
        mbs = [mb for c in (0, 1) for _, mb in data[c][s]]
        ref_opt.zero_grad()
        sums, counts = zip(*(reference.loss_terms(z, mb["attention_mask"], mb) for z, mb in zip(zs, mbs)))
        (sum(sums) / sum(counts)).backward()
        ref_opt.step()
        for c, offset in ((0, 0), (1, 2)):
            own = sum(counts[offset : offset + 2])
            loss, grads = answers[c][s]
            assert loss == pytest.approx(float(sum(s.detach() for s in sums[offset : offset + 2])) / own, rel=1e-5)
            for i in range(2):  # dL_c/dz with L_c the cluster's own mean = joint gradient x C / C_c
                expected = zs[offset + i].grad * (sum(counts) / own)
                torch.testing.assert_close(grads[i], expected, rtol=1e-5, atol=1e-7)
    for name, p in head.named_parameters():
        torch.testing.assert_close(p.detach(), dict(reference.named_parameters())[name].detach(), rtol=1e-5, atol=1e-7)
    assert len(host.served_order) == 6


@dataclass
class _Req:
    round: int
    cluster: int
    seq: int


def test_a_cluster_that_never_arrives_is_left_out_after_the_timeout():
    ran = []
    steps = JointSteps(
        lambda reqs: ran.append(sorted(r.cluster for r in reqs)) or {r.cluster: (0.0, []) for r in reqs}, timeout_s=0.3
    )
    steps.open_round(1, [0, 1])
    assert steps.submit(_Req(1, 0, 1)) == (0.0, [])  # cluster 1 never sends step 1
    assert ran == [[0]] and steps.dropped == {1}
    assert steps.submit(_Req(1, 0, 2)) == (0.0, [])  # no more waiting for the dropped cluster
    assert steps.submit(_Req(1, 1, 1)) is None  # the late cluster is served alone by the host
    assert ran == [[0], [0]]


def test_a_non_finite_step_is_refused_and_changes_nothing():
    torch.manual_seed(0)
    head = TokenHead()
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    z, mb = _micro_batch(1, 2, 3)
    head_step(head, optimizer, [z], [mb])  # one good step: the optimizer has state
    before = copy.deepcopy(head.state_dict())
    state_before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(ValueError, match="not finite"):
        head_step(head, optimizer, [torch.full_like(z, 3e38)], [mb])
    for k, v in head.state_dict().items():
        assert torch.equal(v, before[k])
    after = optimizer.state_dict()
    for pid, st in state_before["state"].items():
        for key, value in st.items():
            assert torch.equal(after["state"][pid][key], value)
