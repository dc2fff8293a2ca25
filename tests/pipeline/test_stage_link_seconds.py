"""A stage reports the seconds its D2D link held its hand-overs (eq. 13) apart from its compute seconds (eq. 12),
so the testbed's measured round can be read in parts. Reference: the token bucket's own arithmetic by hand
(bytes beyond the burst at r_k^dd, plus tau_0 per transfer)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.stage import LINK_BURST_BYTES, Stage
from collapipe_flwr.testbed.token_bucket import TokenBucket

WIDTH = 64
RATE = 1.0e6  # bytes/s
LATENCY = 0.005  # tau_0 per hand-over


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, hidden, mask):
        return self.lin(hidden)


def one_step(stage: Stage, m: int):
    stage.begin_step()
    x = torch.randn(8, 16, WIDTH)
    mask = torch.ones(8, 16)
    for i in range(m):
        stage.forward(i, x, mask)
    for i in range(m):
        stage.backward(i, torch.ones_like(x))
    return stage.step()


def test_link_seconds_follow_the_bucket_and_stay_out_of_compute():
    torch.manual_seed(0)
    stage = Stage(0, nn.ModuleList([Block()]), OptimizerSpec(name="sgd", lr=0.1))
    m = 2
    assert one_step(stage, m).link == 0.0  # an unthrottled host: no D2D hold
    stage.link = TokenBucket(RATE, LINK_BURST_BYTES, LATENCY)
    seconds = one_step(stage, m)
    transfers = 2 * m  # every forward hands z on, every backward hands dL/dz back
    nbytes = 8 * 16 * WIDTH * 4
    # by hand: the first transfer is paid beyond the full burst, the next ones in full (the bucket is in debt,
    # refilled only over the microseconds of compute between them), each plus tau_0
    by_hand = (transfers * nbytes - LINK_BURST_BYTES) / RATE + transfers * LATENCY
    assert seconds.link == pytest.approx(by_hand, rel=0.15)
    assert seconds.compute < 0.5 * seconds.link  # the link's hold is not in compute
    # a new step starts from zero
    stage.link = None
    assert one_step(stage, m).link == 0.0
