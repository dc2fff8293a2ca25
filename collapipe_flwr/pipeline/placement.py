"""Which device holds which TEBs: the segments a partition delta puts on each device, and whether the live devices
already hold the whole encoder (pure functions over the devices' layouts; ``ClusterPipeline`` applies them)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from torch import nn

from collapipe_flwr.models.split import renumber_blocks
from collapipe_flwr.pipeline.executors import StageSpec


def whole_encoder_holders(layout: Mapping[int, tuple[int, int]], num_blocks: int) -> dict[int, tuple[int, int]]:
    """{device k: (a, b)} of the devices in ``layout`` that hold blocks a..b-1, when together they hold the whole
    encoder of L = ``num_blocks`` blocks exactly once; else {}."""
    held = {k: ab for k, ab in layout.items() if ab[1] > ab[0]}
    a0 = 0
    for a, b in sorted(held.values()):
        if a != a0:
            return {}
        a0 = b
    return held if held and a0 == num_blocks else {}


def segment_specs(
    bounds: Sequence[tuple[int, int, int]],
    slowdown: Mapping[int, float],
    template: nn.Module | None,
    blocks: nn.ModuleList | None = None,
    weights: dict | None = None,
    optimizer_state: dict | None = None,
) -> list[StageSpec]:
    """One StageSpec per segment (k, a, b) of ``bounds``: a copy of ``blocks[a:b]``, or ``template`` copies loaded
    with ``weights`` (names ``"{l}.{param}"`` of the whole encoder), with that segment's optimizer state."""
    specs: list[StageSpec] = []
    for k, a, b in bounds:
        if blocks is not None:
            segment = copy.deepcopy(nn.ModuleList(blocks[a:b]))
        elif template is None:
            raise ValueError("segment_specs needs the encoder's blocks or a template block")
        else:
            segment = nn.ModuleList(copy.deepcopy(template) for _ in range(b - a))
            segment.load_state_dict(renumber_blocks(weights or {}, -a, range(a, b)), strict=True)
        specs.append((k, segment, renumber_blocks(optimizer_state or {}, -a, range(a, b)), slowdown.get(k, 1.0), a))
    return specs
