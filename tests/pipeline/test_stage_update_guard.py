"""A stage refuses to update while a micro-batch's backward has not run (GPipe submits each stage's update right
behind its backward, pipeline/gpipe.py): a step that failed part-way never applies part of its gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.stage import Stage


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, hidden, mask):
        return self.lin(hidden)


def make_stage() -> Stage:
    torch.manual_seed(0)
    return Stage(0, nn.ModuleList([Block()]), OptimizerSpec(name="sgd", lr=0.1))


def weights(stage: Stage) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in stage.segment.state_dict().items()}


def test_an_update_after_a_partial_backward_is_refused_and_leaves_the_weights():
    stage = make_stage()
    stage.begin_step()
    mask = torch.ones(2, 3)
    for i in range(2):
        stage.forward(i, torch.randn(2, 3, 4), mask)
    stage.backward(1, torch.ones(2, 3, 4))  # micro-batch 0's backward never ran
    before = weights(stage)
    with pytest.raises(RuntimeError, match=r"device 0: no update, the backward of micro-batch\(es\) \[0\]"):
        stage.step()
    after = weights(stage)
    assert all(torch.equal(before[k], after[k]) for k in before)
    stage.begin_step()  # the next step starts clean and updates
    stage.forward(0, torch.randn(2, 3, 4), mask)
    stage.backward(0, torch.ones(2, 3, 4))
    stage.step()
    assert not torch.equal(weights(stage)["0.lin.bias"], after["0.lin.bias"])
