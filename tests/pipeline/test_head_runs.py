"""The head takes a GPipe step's stackable micro-batches in one call (pipeline.head.stack_runs, head_step).

Reference: the head's own loss_terms on each micro-batch by hand, summed and divided by the whole batch's
target count (docs/contracts.md), and autograd of that sum; the stacked step must give the same loss,
dL/dz_enc per micro-batch and per-run terms, in fewer head calls."""

from __future__ import annotations

import torch

from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.pipeline.head import head_step, stack_runs


def _head():
    torch.manual_seed(0)
    config = BertSplitConfig(
        vocab_size=29, hidden=16, n_heads=2, d_ff=32, layers=2, dropout=0.0, max_len=16, head="token_crf", num_labels=5
    )
    return build_bert(config).head.double()


def _micro_batch(rows: int, T: int, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (rows,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    labels = torch.randint(0, 5, (rows, T), generator=g).masked_fill(mask == 0, -100)
    labels[:, 0] = -100  # [CLS]
    z = torch.randn(rows, T, 16, generator=g, dtype=torch.float64)
    return z, {"attention_mask": mask, "labels": labels}


class _Counting(torch.nn.Module):
    """The head, counting its loss_terms calls."""

    def __init__(self, head):
        super().__init__()
        self.head, self.calls = head, 0

    def loss_terms(self, hidden, attention_mask, batch):
        self.calls += 1
        return self.head.loss_terms(hidden, attention_mask, batch)


def test_runs_follow_layout_and_breaks():
    z8, mb8 = _micro_batch(3, 8, 0)
    z6, mb6 = _micro_batch(2, 6, 1)
    z8b, mb8b = _micro_batch(1, 8, 2)  # fewer rows, same trailing shapes: stacks with z8
    zs, mbs = [z8, z8b, z6, z8], [mb8, mb8b, mb6, mb8]
    assert stack_runs(zs, mbs) == [range(0, 2), range(2, 3), range(3, 4)]
    assert stack_runs(zs, mbs, breaks=[1]) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    assert stack_runs([z8, z8, z8], [mb8, mb8, mb8], breaks=[2]) == [range(0, 2), range(2, 3)]
    odd = {**mb8, "ids": [1, 2, 3]}  # a value that is not a tensor: never stacked
    assert stack_runs([z8, z8], [odd, odd]) == [range(0, 1), range(1, 2)]


def test_a_stacked_step_equals_the_per_micro_batch_sum_in_fewer_head_calls():
    head = _Counting(_head())
    parts = [_micro_batch(3, 8, 0), _micro_batch(2, 8, 1), _micro_batch(2, 6, 2), _micro_batch(1, 6, 3)]
    zs, mbs = [z for z, _ in parts], [mb for _, mb in parts]
    # by hand: each micro-batch's (l_i, c_i), loss sum_i l_i / C, gradients of that by autograd
    leaves = [z.clone().requires_grad_(True) for z in zs]
    pairs = [head.head.loss_terms(z, mb["attention_mask"], mb) for z, mb in zip(leaves, mbs)]
    total = sum(float(c) for _, c in pairs)
    expected = sum(l for l, _ in pairs) / total
    expected.backward()
    terms: list = []
    loss, grads = head_step(head, None, zs, mbs, terms)
    assert head.calls == 2  # the two 8-token micro-batches in one call, the two 6-token ones in another
    assert abs(loss - expected.item()) < 1e-12
    for got, leaf in zip(grads, leaves):
        torch.testing.assert_close(got, leaf.grad, rtol=1e-10, atol=1e-12)
    sums = [(float(l.detach()), float(c)) for l, c in pairs]
    want = [
        (sums[0][0] + sums[1][0], sums[0][1] + sums[1][1], 2),
        (sums[2][0] + sums[3][0], sums[2][1] + sums[3][1], 2),
    ]
    assert [t[2] for t in terms] == [2, 2]
    for (l, c, _), (wl, wc, _) in zip(terms, want):
        assert abs(l - wl) < 1e-9 and c == wc
