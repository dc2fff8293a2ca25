"""The linear-chain CRF against brute force over every tag sequence, and the CRF NER head end to end."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.models.crf import LinearChainCRF, pack_left


def _random_crf(C: int, seed: int) -> LinearChainCRF:
    torch.manual_seed(seed)
    crf = LinearChainCRF(C)
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


def _score_by_hand(crf: LinearChainCRF, emissions: torch.Tensor, tags: list[int]) -> float:
    """s(y) written out from the definition for one unpadded row."""
    crf = crf.requires_grad_(False)
    s = float(crf.start[tags[0]]) + float(crf.end[tags[-1]])
    for t, y in enumerate(tags):
        s += float(emissions[t, y])
        if t:
            s += float(crf.transitions[tags[t - 1], y])
    return s


@pytest.mark.parametrize("seed", range(4))
def test_log_partition_likelihood_and_viterbi_equal_brute_force(seed):
    C, T, lengths = 3, 4, [4, 2, 1, 3]
    crf = _random_crf(C, seed)
    emissions = torch.randn(len(lengths), T, C, dtype=torch.float64)
    crf = crf.double()
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    tags = torch.randint(0, C, (len(lengths), T))
    log_z = crf.log_partition(emissions, mask)
    ll = crf.log_likelihood(emissions, tags, mask)
    best = crf.viterbi(emissions, mask)
    for b, n in enumerate(lengths):
        scores = {seq: _score_by_hand(crf, emissions[b], list(seq)) for seq in itertools.product(range(C), repeat=n)}
        ref_z = math.log(sum(math.exp(v) for v in scores.values()))
        assert float(log_z[b].detach()) == pytest.approx(ref_z, abs=1e-9)
        gold = tuple(tags[b, :n].tolist())
        assert float(ll[b].detach()) == pytest.approx(scores[gold] - ref_z, abs=1e-9)
        assert tuple(best[b]) == max(scores, key=scores.get)


def test_empty_row_contributes_nothing():
    crf = _random_crf(3, 0)
    emissions = torch.randn(2, 3, 3)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    ll = crf.log_likelihood(emissions, torch.zeros(2, 3, dtype=torch.long), mask)
    assert float(ll[1].detach()) == 0.0
    assert crf.viterbi(emissions, mask)[1] == []


def test_pack_left_moves_kept_positions_first_in_order():
    values = torch.arange(12).view(2, 6)
    keep = torch.tensor([[False, True, True, False, True, False], [True, False, False, False, False, True]])
    packed, mask, source = pack_left(values, keep)
    assert packed[0, :3].tolist() == [1, 2, 4] and mask[0].tolist() == [True] * 3 + [False] * 3
    assert packed[1, :2].tolist() == [6, 11] and mask[1].sum() == 2
    assert source[0, :3].tolist() == [1, 2, 4]


def test_crf_head_loss_is_the_nll_of_the_labelled_tokens_and_predicts_at_them():
    torch.manual_seed(0)
    sizes = dict(vocab_size=50, hidden=16, n_heads=2, d_ff=32, layers=1, dropout=0.0, max_len=16)
    model = build_bert(BertSplitConfig(**sizes, head="token_crf", num_labels=3))
    head = model.head.eval()
    hidden = torch.randn(2, 6, 16)
    # row 0: [CLS] a b c [SEP] pad ; row 1: [CLS] a [SEP] pad pad pad
    labels = torch.tensor([[-100, 0, 2, 1, -100, -100], [-100, 1, -100, -100, -100, -100]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    batch = {"labels": labels}
    loss_sum, count = head.loss_terms(hidden, attention, batch)
    emissions = head.logits(hidden)
    ref = -(
        head.crf.log_likelihood(emissions[0:1, 1:4], labels[0:1, 1:4], torch.ones(1, 3, dtype=torch.bool))
        + head.crf.log_likelihood(emissions[1:2, 1:2], labels[1:2, 1:2], torch.ones(1, 1, dtype=torch.bool))
    )
    assert int(count) == 4
    assert float(loss_sum.detach()) == pytest.approx(float(ref.sum().detach()), rel=1e-6)
    with_labels = head.predict(hidden, attention, batch)
    without_labels = head.predict(hidden, attention)
    assert torch.equal(with_labels, without_labels)
    expected = head.crf.viterbi(emissions[0:1, 1:4], torch.ones(1, 3, dtype=torch.bool))[0]
    assert with_labels[0, 1:4].tolist() == expected
    assert with_labels[0, [0, 4, 5]].tolist() == [0, 0, 0]
