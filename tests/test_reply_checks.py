"""The server refuses CU replies that would corrupt the global model (each case one line, others kept)."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.server.aggregation.reply_checks import check_reply

EXPECTED = {
    "embedding": {"weight": torch.zeros(4, 3)},
    "encoder": {"0.w": torch.zeros(3, 3), "0.n": torch.zeros(2, dtype=torch.long)},
}


def _good():
    return {part: {k: v.clone() for k, v in sd.items()} for part, sd in EXPECTED.items()}


def test_a_good_reply_passes():
    check_reply(_good(), {"num-examples": 64, "train-loss": 3.2}, EXPECTED, max_examples=640)
    check_reply(_good(), {"num-examples": 64, "train-loss": 0.0, "seconds-train": 1.5}, EXPECTED, max_examples=640)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda p, m: p["encoder"].__setitem__("0.w", torch.full((3, 3), float("nan"))), "NaN"),
        (lambda p, m: p["encoder"].__setitem__("0.w", torch.zeros(4, 3)), "expected"),
        (lambda p, m: p.__setitem__("head", {"x": torch.zeros(1)}), "parts"),
        (lambda p, m: p.pop("encoder"), "parts"),
        (lambda p, m: p["encoder"].pop("0.n"), "lacks encoder.0.n"),
        (lambda p, m: m.__setitem__("num-examples", -100), "num-examples"),
        (lambda p, m: m.__setitem__("num-examples", 1e12), "num-examples"),
        (lambda p, m: m.__setitem__("num-examples", 2.5), "num-examples"),
        # the training loss the server averages and feeds to the queues Y_n (a missing one raised KeyError, a list
        # TypeError, after the new global model was averaged; NaN and 1e308 were recorded as null)
        (lambda p, m: m.pop("train-loss"), "lacks the metric train-loss"),
        (lambda p, m: m.__setitem__("train-loss", [1.0, 2.0]), "train-loss"),
        (lambda p, m: m.__setitem__("train-loss", float("nan")), "train-loss=nan"),
        (lambda p, m: m.__setitem__("train-loss", 1e308), "train-loss=1e"),
        (lambda p, m: m.__setitem__("train-loss", -0.5), "train-loss=-0.5"),
        (lambda p, m: m.__setitem__("train-loss", True), "train-loss=True"),
        (lambda p, m: m.__setitem__("seconds-train", [3.0]), "seconds-train"),
        (lambda p, m: m.__setitem__("seconds-train", float("inf")), "seconds-train"),
        # the virtual clock's parts, which the server adds up into the round (issue 63)
        (lambda p, m: m.__setitem__("virtual-compute-s", -1.0), "virtual-compute-s=-1.0"),
        (lambda p, m: m.__setitem__("virtual-cluster-s", float("nan")), "virtual-cluster-s=nan"),
        (lambda p, m: m.__setitem__("virtual-device-s", [1.0, float("inf")]), "virtual-device-s"),
    ],
)
def test_bad_replies_are_refused_with_one_line(mutate, match):
    parts, metrics = _good(), {"num-examples": 64, "train-loss": 3.2}
    mutate(parts, metrics)
    with pytest.raises(CollaPipeError, match=match) as err:
        check_reply(parts, metrics, EXPECTED, max_examples=640)
    assert "\n" not in str(err.value)
