"""A model split the way CollaPipe splits it (paper Section III.B, eqs. (3)-(4)).

Three parts: the embedding layer (runs on the CU), the ordered list of L Transformer encoder blocks
(TEBs) that devices train in segments, and the server-side part (decoder + generator, or a task head).

A partition is delta = (delta_1..delta_K): delta_k TEBs on device k, zeros allowed, sum_k delta_k = L.
Device k with delta_k > 0 holds blocks [sum_{j<k} delta_j, sum_{j<=k} delta_j); S = #{k: delta_k > 0}
is the number of segments. The paper's concatenation theta^enc = theta^1 (+) ... (+) theta^S (eq. (4))
is :func:`concat_segments`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from collapipe_flwr.errors import PartitionError

# "hf": a Hugging Face model cut by models/hf (its model type on the blocks, ``blocks[0].model_type``)
FAMILIES = ("transformer", "bert", "hf")
V = TypeVar("V")


class TaskHead(nn.Module):
    """The server-side part (decoder + generator, or a task head). Loss scaling is explicit
    (docs/contracts.md): per batch it returns the SUM of its per-target losses and the target count."""

    def loss_terms(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of per-target losses, number of targets) of z_enc ``hidden`` for ``batch``."""
        raise NotImplementedError

    def target_count(self, attention_mask: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The count :meth:`loss_terms` returns, from the batch alone (no forward): 1F1B scales micro-batch i's
        loss by the whole batch's C before the other micro-batches reach the head. Default: labels != -100
        (token and sentence heads, the CRF head's labelled tokens); a head that counts otherwise overrides it."""
        return (batch["labels"] != -100).sum()


# The three modules of the paper's split, in this order everywhere (what a CU uploads, what a saved model holds):
# the embedding on the CU, the encoder's TEBs on the devices, the decoder / task head on the server.
PARTS = ("embedding", "encoder", "head")


@dataclass
class SplitModel:
    """embedding (CU) -> blocks (L TEBs, devices) -> head (server), see docs/contracts.md."""

    embedding: nn.Module
    blocks: nn.ModuleList
    head: TaskHead
    family: str

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")

    @property
    def num_blocks(self) -> int:
        """L, the number of TEBs."""
        return len(self.blocks)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """z_enc of the plain (unsplit) model: embedding -> every block in order."""
        hidden = self.embedding(input_ids)
        for block in self.blocks:
            hidden = block(hidden, attention_mask)
        return hidden

    def loss_terms(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of per-target losses, number of targets) of the plain model on ``batch``."""
        z_enc = self.encode(batch["input_ids"], batch["attention_mask"])
        return self.head.loss_terms(z_enc, batch["attention_mask"], batch)

    def parts(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        """(embedding, blocks, head): the modules of :data:`PARTS`, in that order."""
        return self.embedding, self.blocks, self.head

    def train(self, mode: bool = True) -> SplitModel:
        for part in self.parts():
            part.train(mode)
        return self

    def eval(self) -> SplitModel:
        return self.train(False)

    def parameters(self):
        for part in self.parts():
            yield from part.parameters()


def validate_partition(
    delta: Sequence[int],
    L: int | None,
    max_blocks_per_device: Sequence[int] | None = None,
    *,
    num_devices: int | None = None,
    memory_note: str = "",
) -> tuple[int, ...]:
    """The one check of a partition delta = (delta_1..delta_K); returns it as a tuple of ints.

    delta_k must be whole numbers >= 0 summing to the encoder's L TEBs (``L=None``: any total >= 1, for a
    delta whose L is not known here). ``num_devices`` is K (at most K entries). ``max_blocks_per_device[k]``
    is how many TEBs device k can hold in memory (constraint C7; it also bounds K); a delta_k above it is
    rejected, ``memory_note`` saying for what (e.g. a batch's activations). Every problem raises
    :class:`PartitionError` saying what to change.
    """
    try:
        values = [int(d) for d in delta]
    except (TypeError, ValueError):
        raise PartitionError(f"partition delta={delta!r} must be a list of integers (blocks per device)") from None
    if any(int(d) != d for d in delta):
        raise PartitionError(f"partition delta={list(delta)} must hold whole numbers of blocks")
    caps = None if max_blocks_per_device is None else [int(c) for c in max_blocks_per_device]
    K = len(caps) if num_devices is None and caps is not None else num_devices
    if K is not None and len(values) > K:
        raise PartitionError(
            f"partition delta={values} names {len(values)} devices but the cluster has K={K} device profiles; give at "
            f"most {K} entries"
        )
    if L is not None and L < 1:
        raise PartitionError(f"the encoder has L={L} blocks; build a model with at least one encoder block")
    if not values:
        summing = "" if L is None else f" summing to L={L}"
        raise PartitionError(f"partition delta is empty; give one entry per device{summing}")
    negative = [k for k, d in enumerate(values) if d < 0]
    if negative:
        k = negative[0]
        raise PartitionError(
            f"partition delta={values} gives device {k} delta_{k}={values[k]} blocks; use 0 or more blocks per device"
        )
    total = sum(values)
    if L is None and total < 1:
        raise PartitionError(f"partition delta={values} assigns no block; give at least one device a block")
    if L is not None and total != L:
        change = "remove" if total > L else "add"
        raise PartitionError(
            f"partition delta={values} assigns {total} blocks but the encoder has L={L}; {change} {abs(total - L)} "
            f"block(s) so the entries sum to {L}"
        )
    for k, (d, cap) in enumerate(zip(values, caps or [])):
        if d > cap:
            where, shrink = (
                (f"for {memory_note}", ", shrink the batch") if memory_note else ("in its memory budget", "")
            )
            raise PartitionError(
                f"device {k} can hold at most {cap} block(s) {where} but delta_{k}={d}; move {d - cap} block(s) to "
                f"other devices{shrink} or raise its memory_bytes"
            )
    return tuple(values)


def segment_bounds(delta: Sequence[int]) -> list[tuple[int, int, int]]:
    """(device index k, first block, end block) for every device with delta_k > 0, in pipeline order."""
    bounds, start = [], 0
    for k, d in enumerate(delta):
        if d > 0:
            bounds.append((k, start, start + d))
        start += d
    return bounds


def block_key(name: str) -> tuple[int, str]:
    """``"{l}.{param}"`` -> (l, param): the block number a state-dict key of a ModuleList of TEBs starts with."""
    head, _, rest = name.partition(".")
    if not head.isdigit() or not rest:
        raise PartitionError(
            f"state dict key {name!r} does not start with a block number; use a ModuleList of blocks' state_dict()"
        )
    return int(head), rest


def renumber_blocks(state: Mapping[str, V], shift: int, blocks: range | None = None) -> dict[str, V]:
    """The one block renumbering between a segment's local block numbers and the encoder's global ones.

    Key ``"{l}.{param}"`` becomes ``"{l + shift}.{param}"``, keeping only blocks l in ``blocks`` (all when
    None). Segment (a, b) -> encoder: ``shift=a`` (local j is global a + j); encoder -> segment (a, b):
    ``shift=-a, blocks=range(a, b)`` (global a..b-1 become local 0..b-a-1).
    """
    out: dict[str, V] = {}
    for name, value in state.items():
        l, rest = block_key(name)
        if blocks is None or l in blocks:
            out[f"{l + shift}.{rest}"] = value
    return out


def concat_segments(segments: Sequence[Mapping[str, torch.Tensor]], delta: Sequence[int]) -> dict[str, torch.Tensor]:
    """The paper's (+) (eq. (4)): theta^enc = theta^1 (+) ... (+) theta^S.

    ``segments`` holds one state dict per device of ``delta`` (empty ones for delta_k = 0), or one per
    non-empty segment in order. Local block j of device k becomes global block sum_{i<k} delta_i + j.
    """
    delta = validate_partition(delta, None)
    bounds = segment_bounds(delta)
    if len(segments) == len(delta):
        pairs = [(segments[k], k, a, b) for k, a, b in bounds]
        for k, d in enumerate(delta):
            if d == 0 and len(segments[k]) > 0:
                raise PartitionError(
                    f"device {k} has delta_{k}=0 but sent a non-empty segment; send {{}} or give it blocks in delta"
                )
    elif len(segments) == len(bounds):
        pairs = [(seg, k, a, b) for seg, (k, a, b) in zip(segments, bounds)]
    else:
        raise PartitionError(
            f"{len(segments)} segment state dicts for delta={list(delta)}; give one per device ({len(delta)}) or one "
            f"per non-empty segment ({len(bounds)})"
        )
    out: dict[str, torch.Tensor] = {}
    for seg, k, a, b in pairs:
        held = {block_key(name)[0] for name in seg}
        if any(j >= b - a for j in held):
            raise PartitionError(
                f"device {k} sent block {max(held)} but holds delta_{k}={b - a} blocks; its segment and delta disagree"
            )
        if len(held) != b - a:
            raise PartitionError(
                f"device {k} sent {len(held)} block(s) but delta_{k}={b - a}; its segment and delta disagree"
            )
        out.update(renumber_blocks(seg, a))
    return out
