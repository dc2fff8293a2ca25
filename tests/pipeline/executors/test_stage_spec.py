"""StageSpec, what a stage is to hold when a plan is placed: its fields, its transport (pickled, as Ray pickles what
crosses to a device actor) and LocalStages placing a plan from it (each device k holds its blocks from its offset,
at its slowdown)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch
from torch import nn

from collapipe_flwr.pipeline.executors import LocalStages, StageSpec
from collapipe_flwr.pipeline.optim import OptimizerSpec

SGD = OptimizerSpec(name="sgd", lr=0.1)


def _blocks(n: int) -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Linear(4, 4) for _ in range(n))


def test_a_spec_names_its_fields_and_keeps_what_a_device_holds_by_default():
    spec = StageSpec(2)
    assert (spec.device, spec.segment, spec.optimizer_state, spec.slowdown, spec.offset) == (2, None, None, 1.0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.offset = 1  # type: ignore[misc]


def test_a_spec_pickles_with_its_segment_and_optimizer_state():
    segment = _blocks(2)
    state = {"state": {0: {"momentum_buffer": torch.ones(4, 4)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    spec = StageSpec(1, segment, state, slowdown=2.5, offset=3)
    back = pickle.loads(pickle.dumps(spec))
    assert (back.device, back.slowdown, back.offset) == (1, 2.5, 3)
    assert back.segment is not None and back.optimizer_state is not None
    for (name, a), (_, b) in zip(segment.state_dict().items(), back.segment.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(back.optimizer_state["state"][0]["momentum_buffer"], torch.ones(4, 4))


def test_local_stages_place_each_spec_on_its_device_at_its_offset_and_slowdown():
    blocks = _blocks(5)
    specs = [
        StageSpec(2, copy.deepcopy(nn.ModuleList(blocks[0:2])), None, slowdown=3.0, offset=0),
        StageSpec(0, copy.deepcopy(nn.ModuleList(blocks[2:5])), None, slowdown=1.0, offset=2),
    ]
    stages = LocalStages(specs, SGD)
    assert stages.device_indices == [2, 0]  # stage s runs on specs[s].device
    assert stages.layout() == {2: (0, 2), 0: (2, 5)}
    assert [stage.slowdown for stage in stages.stages] == [3.0, 1.0]
    for k, (a, b) in stages.layout().items():
        held = stages.get_weights(k)
        want = nn.ModuleList(blocks[a:b]).state_dict()
        assert held.keys() == want.keys() and all(torch.equal(held[n], want[n]) for n in want)
    # a plan the devices hold already: specs without a segment keep the blocks, the stage order follows the specs
    stages.place([StageSpec(0, offset=2), StageSpec(2, slowdown=3.0)], free_others=False)
    assert stages.device_indices == [0, 2] and stages.layout() == {2: (0, 2), 0: (2, 5)}
