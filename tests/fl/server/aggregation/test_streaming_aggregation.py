"""Streaming aggregation (issue 30): each CU's reply is folded into a running sum as it arrives.

References computed here, independent of the code under test: the plain NumPy (float64) example-weighted mean
sum_n w_n theta_n / sum_n w_n over all replies at once, the server optimizers' published formulas
(``tests/fl/server/aggregation/test_server_optimizer.py``'s ``Reference``), and central DP's noise drawn as
documented (a generator seeded by (seed, round t), N(0, (z C / n)^2) per floating tensor in the state's order).
The grid tests use a fake Flower grid with ``push_messages`` / ``pull_messages`` and check that each reply is
pulled on its own and handed over before the next pull, and that a CU that never answers is waited for only until
the timeout.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from collapipe_flwr.config import PrivacySpec
from collapipe_flwr.dssra.specs import MethodSpec
from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.server.aggregation.global_model import GlobalModel, flatten_parts
from collapipe_flwr.fl.server.aggregation.server_optimizer import ServerOptimizer
from collapipe_flwr.fl.server.reply_stream import StreamingGrid
from collapipe_flwr.fl.weighted_mean import WeightedSum
from collapipe_flwr.models.split import SplitModel
from tests.fl.server.aggregation.test_server_optimizer import HYPER, Reference

WEIGHTS = [3.0, 5.0, 2.0, 7.0]


def _states(rng: np.random.Generator, n: int) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "w32": torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32)),
            "w64": torch.from_numpy(rng.standard_normal(4)),
            "w16": torch.from_numpy(rng.standard_normal(6).astype(np.float16)),
            "same_ids": torch.arange(4),
            "batches": torch.tensor(10 * (i + 1)),
            "mask": torch.tensor([True, False]),
        }
        for i in range(n)
    ]


def _plain_mean(states, weights, key: str) -> np.ndarray:
    values = [s[key].double().numpy() for s in states]
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def test_weighted_sum_is_the_plain_weighted_mean():
    states = _states(np.random.default_rng(1), len(WEIGHTS))
    folded = WeightedSum()
    for state, w in zip(states, WEIGHTS):
        folded.add(state, w)
    assert folded.count == 4 and folded.total == sum(WEIGHTS)
    means = folded.means()
    assert {k: v.dtype for k, v in means.items()} == {k: v.dtype for k, v in states[0].items()}
    np.testing.assert_allclose(means["w32"].double().numpy(), _plain_mean(states, WEIGHTS, "w32"), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(means["w64"].numpy(), _plain_mean(states, WEIGHTS, "w64"), rtol=1e-13)
    np.testing.assert_allclose(means["w16"].double().numpy(), _plain_mean(states, WEIGHTS, "w16"), rtol=1e-3, atol=1e-3)
    assert torch.equal(means["same_ids"], torch.arange(4)) and torch.equal(means["mask"], torch.tensor([True, False]))
    # differing integers: the weighted mean, rounded: (3*10 + 5*20 + 2*30 + 7*40) / 17 = 27.6 -> 28
    assert torch.equal(means["batches"], torch.tensor(int(np.rint(_plain_mean(states, WEIGHTS, "batches")))))


def test_a_state_of_another_layout_or_a_bad_weight_is_refused_before_anything_changes():
    states = _states(np.random.default_rng(2), 2)
    folded = WeightedSum()
    folded.add(states[0], 2.0)
    before = folded.means()
    bad = [
        ({**states[1], "w32": torch.zeros(5, 4)}, 1.0, "w32"),
        ({k: v for k, v in states[1].items() if k != "mask"}, 1.0, "mask"),
        ({**states[1], "w64": states[1]["w64"].float()}, 1.0, "w64"),
        (states[1], float("nan"), "finite"),
        (states[1], -1.0, "finite"),
    ]
    for state, weight, text in bad:
        with pytest.raises(CollaPipeError, match=text):
            folded.add(state, weight)
    assert folded.count == 1 and folded.total == 2.0
    assert all(torch.equal(before[k], v) for k, v in folded.means().items())
    with pytest.raises(CollaPipeError, match="sum to zero"):
        zero = WeightedSum()
        zero.add(states[0], 0.0)
        zero.means()


# ---------------------------------------------------------------------------------------------- GlobalModel


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 3)


def _global_model(server_optimizer: ServerOptimizer, privacy: PrivacySpec | None = None) -> GlobalModel:
    torch.manual_seed(0)
    model = SplitModel(nn.Embedding(9, 4), nn.ModuleList([nn.Linear(4, 4), nn.LayerNorm(4)]), _Head(), "transformer")
    return GlobalModel(model, MethodSpec(), server_optimizer, privacy=privacy, seed=5)


def _replies(rng: np.random.Generator, global_model: GlobalModel, n: int):
    """n CUs' returned parts (the global parts + noise) and their num-examples."""
    parts = global_model.returned_parts()
    replies = []
    for i in range(n):
        mine = {
            part: {k: v + torch.from_numpy(rng.normal(0, 0.3, v.shape).astype(np.float32)) for k, v in sd.items()}
            for part, sd in parts.items()
        }
        replies.append((i, mine, float(WEIGHTS[i % len(WEIGHTS)] + i)))
    return replies


def _stream(global_model: GlobalModel, t: int, replies: list) -> None:
    """What the strategy does: fold each reply as it comes, the list giving each one up once folded."""
    fold = global_model.new_round()
    replies.reverse()
    while replies:
        cluster, parts, weight = replies.pop()
        fold.add(cluster, parts, weight)
    global_model.absorb_round(t, fold)


def _np_flat(parts) -> dict[str, np.ndarray]:
    return {k: v.double().numpy() for k, v in flatten_parts(parts).items()}


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedyogi"])
def test_a_streamed_round_is_the_all_at_once_average_through_the_server_optimizer(name):
    rng = np.random.default_rng(7)
    global_model = _global_model(ServerOptimizer(name, **(HYPER if name != "fedavg" else {})))
    reference = Reference(name, **HYPER)
    for t, n in ((1, 3), (2, 30)):  # two rounds: the optimizer's moments carry over
        x = _np_flat(global_model.returned_parts())
        replies = _replies(rng, global_model, n)
        want = reference.step(t, x, [(_np_flat(p), w) for _, p, w in replies])
        _stream(global_model, t, replies)
        got = _np_flat(global_model.returned_parts())
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=2e-6, err_msg=f"{name} t={t} {k}")


def test_central_dp_adds_the_seeded_noise_to_the_streamed_mean():
    privacy = PrivacySpec(mode="central", clipping_norm=0.5, noise_multiplier=0.8)
    global_model = _global_model(ServerOptimizer("fedavg"), privacy)
    replies = _replies(np.random.default_rng(9), global_model, 4)
    flat = [(_np_flat(p), w) for _, p, w in replies]
    mean = {k: sum(s[k] * w for s, w in flat) / sum(w for _, w in flat) for k in flat[0][0]}
    sigma = 0.8 * 0.5 / 4  # z C / n
    generator = torch.Generator().manual_seed(5 * 1_000_003 + 3)  # (run seed, round t)
    _stream(global_model, 3, replies)
    got = _np_flat(global_model.returned_parts())
    assert list(got) == list(mean)  # the noise is drawn in the state's order
    for k, m in mean.items():
        noise = (torch.randn(m.shape, generator=generator, dtype=torch.float64) * sigma).numpy()
        np.testing.assert_allclose(got[k], (m + noise).astype(np.float32), rtol=1e-5, atol=2e-6, err_msg=k)


def test_without_aggregation_each_cluster_keeps_what_it_returned():
    global_model = _global_model(ServerOptimizer("fedavg"))
    global_model.method = MethodSpec(aggregate=False)
    replies = _replies(np.random.default_rng(11), global_model, 2)
    kept = {c: p for c, p, _ in replies}
    _stream(global_model, 1, list(replies))
    for cluster, parts in kept.items():
        assert all(torch.equal(global_model.for_cluster(cluster)["encoder"][k], v) for k, v in parts["encoder"].items())


# ---------------------------------------------------------------------------------------------- the grid


class _Reply:
    def __init__(self, message_id: str) -> None:
        self.metadata = type("Metadata", (), {"reply_to_message_id": message_id})()


class _PullGrid:
    """A Flower-like grid: messages pushed as ids; ``silent`` ids never get a reply; logs every call."""

    pull_interval = 0.01

    def __init__(self, silent: frozenset[str] = frozenset()) -> None:
        self.silent, self.calls = silent, []

    def push_messages(self, messages):
        ids = [str(m) for m in messages]
        self.calls.append(("push", ids))
        return ids

    def pull_messages(self, message_ids):
        ids = list(message_ids)
        self.calls.append(("pull", ids))
        return [_Reply(i) for i in ids if i not in self.silent]


def test_replies_are_pulled_one_by_one_and_each_is_handed_over_before_the_next_pull():
    grid = _PullGrid()
    replies = StreamingGrid(grid).send_and_receive(["a", "b", "c"], timeout=5.0)
    assert grid.calls == [("push", ["a", "b", "c"])]  # pushed at once, nothing pulled yet
    got = []
    for reply in replies:
        got.append(reply.metadata.reply_to_message_id)
        assert grid.calls[-1] == ("pull", [got[-1]])  # this reply's pull was the last call
    assert got == ["a", "b", "c"]


def test_a_cu_that_never_answers_is_waited_for_until_the_timeout_only():
    grid = _PullGrid(silent=frozenset({"b"}))
    t0 = time.time()
    got = [r.metadata.reply_to_message_id for r in StreamingGrid(grid).send_and_receive(["a", "b", "c"], timeout=0.3)]
    waited = time.time() - t0
    assert got == ["a", "c"] and 0.3 <= waited < 2.0
    assert all(ids == ["b"] for kind, ids in grid.calls[4:])  # after the first poll only b is asked for


def test_a_grid_without_push_and_pull_is_asked_with_its_own_send_and_receive():
    class ListGrid:
        def send_and_receive(self, messages, timeout=None):
            return [_Reply(str(m)) for m in messages]

    replies = StreamingGrid(ListGrid()).send_and_receive(["x", "y"], timeout=1.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["x", "y"]
