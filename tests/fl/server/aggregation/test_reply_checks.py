"""The server refuses CU replies that would corrupt the global model (each case one line, others kept).

A reply is its weights and its round report; the report is read once at the Flower boundary
(``RoundReport.from_record``) from the flat metrics written out here by hand, key by key, as a CU sends them."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.fl.server.aggregation.reply_checks import check_reply

EXPECTED = {
    "embedding": {"weight": torch.zeros(4, 3)},
    "encoder": {"0.w": torch.zeros(3, 3), "0.n": torch.zeros(2, dtype=torch.long)},
}
# a CU's reply metrics as they travel (3 devices, 2 steps, the virtual clock on, one device lost and re-planned)
GOOD = {
    "num-examples": 64,
    "train-loss": 3.2,
    "train-loss-first": 3.4,
    "train-loss-last": 3.0,
    "train-losses": [3.4, 3.0],
    "steps": 2,
    "lr-factor-first": 0.5,
    "seconds-step-forward": 0.4,
    "seconds-step-total": 1.1,
    "seconds-setup": 0.2,
    "seconds-profile": 0.0,
    "seconds-build-pipeline": 0.1,
    "seconds-upload": 0.05,
    "seconds-finish": 0.01,
    "seconds-train": 1.5,
    "seconds-total": 2.0,
    "virtual-compute-s": 1.0,
    "virtual-d2d-s": 0.2,
    "virtual-cu-s": 0.1,
    "virtual-uplink-s": 0.3,
    "virtual-setup-s": 0.3,
    "virtual-device-s": [0.9, 0.5, 0.0],
    "virtual-cluster-s": 1.9,
    "device-peak-bytes": [1e6, 2e6, 0.0],
    "device-measured-peak-bytes": [0.0, 0.0, 0.0],
    "device-rss-peak-bytes": [0.0, 0.0, 0.0],
    "device-cgroup-peak-bytes": [0.0, 0.0, 0.0],
    "device-memory-limit-bytes": [0.0, 0.0, 0.0],
    "device-compute-seconds": [0.8, 0.4, 0.0],
    "device-pids": [101, 102],
    "device-netns": [1, 1],
    "lost-devices": [2],
    "lost-for-memory": [2],
    "replanned-delta": [3, 3, 0],
    "replanned-m": 2,
    "device-link-seconds": [0.0, 0.0, 0.0],
    "device-cpu-seconds": [0.7, 0.4, 0.0],
    "pipeline-reused": 1,
    "blocks-moved": 0,
    "optimizer-restored": 1,
    "upload-bytes": 4096,
}


def _good():
    return {part: {k: v.clone() for k, v in sd.items()} for part, sd in EXPECTED.items()}


def _check(parts, metrics) -> None:
    check_reply(parts, RoundReport.from_record(metrics), EXPECTED, max_examples=640)


def test_a_good_reply_passes_and_its_report_travels_unchanged():
    _check(_good(), GOOD)
    report = RoundReport.from_record(GOOD)
    assert report.to_record() == GOOD
    assert report.steps.loss == pytest.approx(3.2) and report.steps.count == 2 and report.seconds.train == 1.5
    assert report.replan is not None and report.replan.delta == (3, 3, 0) and report.replan.lost_for_memory == (2,)
    assert report.virtual is not None and report.virtual.cluster == 1.9 and report.testbed is None
    bare = {k: v for k, v in GOOD.items() if not k.startswith(("virtual-", "lost-", "replanned-"))}
    report = RoundReport.from_record(bare)  # no clock, no device lost: both absent, not zero
    assert report.virtual is None and report.replan is None and report.to_record() == bare


def test_a_report_with_a_profile_and_an_empty_round_reads_back():
    metrics = copy.deepcopy(GOOD)
    nan = float("nan")
    profile = {
        "profile-seconds-per-sample-block": [1e-3, nan, 2e-3],
        "profile-microbatch-s": [0.0, nan, 0.0],
        "profile-memory-bytes": [1e9, nan, 2e9],
        "profile-link-bytes-per-s": [1e7, nan, nan],
        "profile-link-latency-s": [1e-3, nan, nan],
        "profile-cu-step-s": 0.02,
        "seconds-uplink-wait": 0.0,
        "testbed-cpu-cores": [0.5, 0.25, 0.5],
    }
    metrics.update(profile, **{"train-losses": [], "steps": 0, "train-loss": 0.0})
    metrics.update({"train-loss-first": nan, "train-loss-last": nan})
    report = RoundReport.from_record(metrics)
    assert report.testbed is not None and report.testbed.cpu_cores == (0.5, 0.25, 0.5) and report.steps.count == 0
    assert json.dumps(report.to_record()) == json.dumps(metrics)  # every key, in order (NaN as NaN)


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
        (lambda p, m: m.__setitem__("num-examples", 0), "num-examples"),
        # the training loss the server averages and feeds to the queues Y_n (a missing one raised KeyError, a list
        # TypeError, after the new global model was averaged; NaN and 1e308 were recorded as null)
        (lambda p, m: m.pop("train-loss"), "lacks the metric train-loss"),
        (lambda p, m: m.__setitem__("train-loss", [1.0, 2.0]), "train-loss"),
        (lambda p, m: m.__setitem__("train-loss", float("nan")), "train-loss=nan"),
        (lambda p, m: m.__setitem__("train-loss", 1e308), "train-loss=1e"),
        (lambda p, m: m.__setitem__("train-loss", -0.5), "train-loss=-0.5"),
        (lambda p, m: m.__setitem__("train-loss", True), "train-loss=True"),
        (lambda p, m: m.__setitem__("train-loss", 2.0), "disagree with its train-losses"),
        (lambda p, m: m.__setitem__("train-losses", [3.4, float("nan")]), "train-losses"),
        (lambda p, m: m.__setitem__("steps", 3), "disagree"),
        (lambda p, m: m.__setitem__("seconds-train", [3.0]), "seconds-train"),
        (lambda p, m: m.__setitem__("seconds-train", float("inf")), "seconds-train"),
        (lambda p, m: m.pop("upload-bytes"), "lacks the metric upload-bytes"),
        (lambda p, m: m.__setitem__("device-pids", [1.5]), "device-pids"),
        (lambda p, m: m.__setitem__("blocks-moved", 7), "preparation flags"),
        (lambda p, m: m.__setitem__("replanned-delta", [3, -3, 0]), "replanned-delta"),
        (lambda p, m: m.__setitem__("surprise", 1.0), "unknown metric surprise"),
        # the virtual clock's parts, which the server adds up into the round (issue 63)
        (lambda p, m: m.__setitem__("virtual-compute-s", -1.0), "virtual-compute-s=-1.0"),
        (lambda p, m: m.__setitem__("virtual-cluster-s", float("nan")), "virtual-cluster-s=nan"),
        (lambda p, m: m.__setitem__("virtual-device-s", [1.0, float("inf")]), "virtual-device-s"),
        (lambda p, m: m.pop("virtual-d2d-s"), "lacks the metric virtual-d2d-s"),
    ],
)
def test_bad_replies_are_refused_with_one_line(mutate, match):
    parts, metrics = _good(), copy.deepcopy(GOOD)
    mutate(parts, metrics)
    with pytest.raises(CollaPipeError, match=match) as err:
        _check(parts, metrics)
    assert "\n" not in str(err.value)
