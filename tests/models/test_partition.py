"""Partition validation (what to change) and the paper's concatenation (+) of segments (eq. (4))."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from collapipe_flwr.errors import CollaPipeError, PartitionError
from collapipe_flwr.models.split import (
    block_key,
    concat_segments,
    renumber_blocks,
    segment_bounds,
    validate_partition,
)


class TinyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)
        self.register_buffer("counter", torch.zeros(1))


def make_blocks(L: int) -> nn.ModuleList:
    torch.manual_seed(L)
    return nn.ModuleList(TinyBlock() for _ in range(L))


def test_valid_partition_is_returned_as_tuple():
    assert validate_partition([1, 3, 2], 6) == (1, 3, 2)
    assert validate_partition((0, 2, 0, 4), 6, [6, 6, 6, 6]) == (0, 2, 0, 4)
    assert validate_partition((0, 2, 0, 4), 6, num_devices=4) == (0, 2, 0, 4)
    assert validate_partition([2.0, 3], None) == (2, 3)  # L unknown: any total >= 1


@pytest.mark.parametrize(
    "delta,L,caps,words",
    [
        ((1, 3, 1), 6, None, ["sum", "add 1 block", "L=6"]),
        ((4, 3), 6, None, ["remove 1 block", "sum to 6"]),
        ((3, -1, 4), 6, None, ["device 1", "0 or more"]),
        ((), 6, None, ["empty"]),
        ((2, 2, 2), 6, [3, 3], ["3 devices", "K=2", "at most 2"]),
        ((1, 4, 1), 6, [6, 3, 6], ["device 1", "at most 3", "move 1 block", "memory_bytes"]),
        ((1.5, 4.5), 6, None, ["whole numbers"]),
        (("a", 2), 6, None, ["integers"]),
        ((0,), 0, None, ["at least one encoder block"]),
        ((0, 0), None, None, ["no block"]),
        ((-1, 2), None, None, ["delta_0=-1", "0 or more"]),
    ],
)
def test_bad_partitions_say_what_to_change(delta, L, caps, words):
    with pytest.raises(PartitionError) as info:
        validate_partition(delta, L, caps)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, CollaPipeError)
    for word in words:
        assert word in message, (word, message)


def test_segment_bounds_skip_idle_devices():
    assert segment_bounds((0, 2, 0, 4)) == [(1, 0, 2), (3, 2, 6)]
    assert segment_bounds((1, 3, 2)) == [(0, 0, 1), (1, 1, 4), (2, 4, 6)]


def test_device_count_and_memory_note():
    with pytest.raises(PartitionError, match="names 3 devices but the cluster has K=2 device profiles"):
        validate_partition((2, 2, 2), 6, num_devices=2)
    with pytest.raises(PartitionError, match=r"at most 1 block\(s\) for a batch of 4x7 tokens .* shrink the batch"):
        validate_partition((2, 4), 6, [1, 6], memory_note="a batch of 4x7 tokens")


def per_segment_states(blocks: nn.ModuleList, delta) -> list[dict]:
    """Each non-empty segment's own state dict (local names from 0), built from its own ModuleList."""
    return [dict(nn.ModuleList(blocks[a:b]).state_dict()) for _, a, b in segment_bounds(delta)]


def test_renumber_blocks_between_segment_and_encoder():
    state = {"0.w": 0, "1.w": 1, "1.b": 2, "2.w": 3, "3.w": 4}
    # encoder -> segment (1, 3): global 1..2 become local 0..1, others dropped
    assert renumber_blocks(state, -1, range(1, 3)) == {"0.w": 1, "0.b": 2, "1.w": 3}
    # segment at offset 2 -> encoder
    assert renumber_blocks({"0.w": 7, "1.x.y": 8}, 2) == {"2.w": 7, "3.x.y": 8}
    assert block_key("12.attn.q.weight") == (12, "attn.q.weight")
    with pytest.raises(PartitionError, match="does not start with a block number"):
        renumber_blocks({"norm.weight": 0}, 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=5).filter(lambda d: sum(d) > 0))
def test_slicing_the_encoder_gives_each_segments_state(delta):
    blocks = make_blocks(sum(delta))
    whole = dict(blocks.state_dict())
    for (_, a, b), own in zip(segment_bounds(delta), per_segment_states(blocks, delta)):
        _assert_same_state(renumber_blocks(whole, -a, range(a, b)), own)


def _assert_same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=5).filter(lambda d: sum(d) > 0))
def test_concatenation_round_trip_gives_the_encoder_state_dict(delta):
    L = sum(delta)
    blocks = make_blocks(L)
    reference = dict(blocks.state_dict())
    per_segment = per_segment_states(blocks, delta)
    # local names start at 0 in every segment
    assert all(next(iter(sd)).startswith("0.") for sd in per_segment)
    _assert_same_state(concat_segments(per_segment, delta), reference)
    # one dict per device, empty for idle ones, works the same
    it = iter(per_segment)
    per_device = [next(it) if d > 0 else {} for d in delta]
    _assert_same_state(concat_segments(per_device, delta), reference)
    # and loads back into a fresh encoder exactly
    fresh = make_blocks(L + 100)[:L]
    nn.ModuleList(fresh).load_state_dict(concat_segments(per_segment, delta), strict=True)


def test_concat_rejects_segments_that_disagree_with_delta():
    blocks = make_blocks(6)
    per_segment = per_segment_states(blocks, (2, 4))
    with pytest.raises(PartitionError, match="delta_0=3"):
        concat_segments(per_segment, (3, 3))
    with pytest.raises(PartitionError, match="one per device"):
        concat_segments(per_segment + [{}, {}], (2, 4, 0))
    with pytest.raises(PartitionError, match="delta_1=0"):
        concat_segments([per_segment[0], per_segment[1], {}], (2, 0, 4))
