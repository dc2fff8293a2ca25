"""1F1B's step on one cluster's stages (``pipeline.schedule: 1f1b``): the same gradients as GPipe's, less memory.

Each stage gets its calls in 1F1B order (``schedule.one_f_one_b_order``: stage k runs min(S - k - 1, m) warm-up
forwards, then one forward / one backward, then the cool-down backwards), so stage k holds at most
min(m, S - k) micro-batches' activations instead of GPipe's m (C7's activation term,
``system.pipeline_model.held_micro_batches``). The head (:class:`~collapipe_flwr.pipeline.head.MicroHead`: the
server's decoder over the data plane, or ``LocalHead``) runs one exchange per micro-batch, m per step: the CU
sends z^enc of micro-batch i as soon as the last stage produced it and gets dL/dz^enc of it back, micro-batch
i's loss sum divided by the whole batch's target count C, and the head takes its one update at the step's end.

The CU submits every call whose input is already submitted (on Ray, stage k+1 then starts on micro-batch i as
soon as stage k finishes it, and every actor runs its calls in submission order: its 1F1B order); only when
nothing else can be submitted does it wait for the earliest z^enc the last stage needs a gradient for.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from collapipe_flwr.accelerator import to_host
from collapipe_flwr.pipeline.cu_embedding import CuEmbedding
from collapipe_flwr.pipeline.executors import Stages
from collapipe_flwr.pipeline.head import HeadFn, MicroHead
from collapipe_flwr.pipeline.schedule import one_f_one_b_order


class _Step:
    """The handles of one 1F1B step: forward outputs, backward outputs and head gradients per (i, k)."""

    def __init__(self, stages: Stages, S: int, cu: CuEmbedding, micro: list[dict]) -> None:
        self.stages, self.S, self.cu, self.micro = stages, S, cu, micro
        self.masks = [stages.put(mb["attention_mask"]) for mb in micro]
        self.queues = [deque(one_f_one_b_order(k, S, len(micro))) for k in range(S)]
        self.out: dict[tuple[int, int], Any] = {}  # (i, k) -> stage k's forward output handle
        self.back: dict[tuple[int, int], Any] = {}  # (i, k) -> stage k's dL/dz^k handle
        self.head_grads: dict[int, torch.Tensor] = {}  # i -> dL/dz_enc from the head

    def ready(self, k: int, kind: str, i: int) -> bool:
        """Stage k's call on micro-batch i has its input: the previous stage's forward, the next stage's
        backward, or (last stage) the head's gradient."""
        if kind == "F":
            return k == 0 or (i, k - 1) in self.out
        return i in self.head_grads if k == self.S - 1 else (i, k + 1) in self.back

    def submit_ready(self) -> None:
        """Submit, stage by stage, every queued call whose input is submitted, until none is."""
        moved = True
        while moved:
            moved = False
            for k, queue in enumerate(self.queues):
                while queue and self.ready(k, *queue[0]):
                    kind, i = queue.popleft()
                    self._submit(k, kind, i)
                    moved = True

    def _submit(self, k: int, kind: str, i: int) -> None:
        if kind == "F":
            x = self.cu.forward(i, self.micro[i]) if k == 0 else self.out[(i, k - 1)]
            self.out[(i, k)] = self.stages.submit_forward(k, i, x, self.masks[i])
        else:
            g = self.head_grads.pop(i) if k == self.S - 1 else self.back[(i, k + 1)]
            self.back[(i, k)] = self.stages.submit_backward(k, i, g)

    def waiting_for_head(self) -> int:
        """The micro-batch the last stage waits on (its next call is that micro-batch's backward)."""
        queue = self.queues[self.S - 1]
        if not queue or queue[0][0] != "B":  # unreachable for a valid 1F1B order
            raise RuntimeError(f"the 1F1B order is stuck with the last stage at {queue[0] if queue else 'its end'}")
        return queue[0][1]


def one_f_one_b_step(
    stages: Stages, S: int, cu: CuEmbedding, micro: list[dict], head: HeadFn | MicroHead, lr_factor: float
) -> tuple[float, dict[str, float]]:
    """1F1B over S stages and m = len(micro) micro-batches with m head exchanges; returns the step loss and the
    seconds of its phases: forward (the interleaved forwards and backwards on the stages, head exchanges
    excluded), head (the m exchanges and the head's update), backward (the CU's wait for stage 0's last
    backwards and the embedding's backward). A ``head`` that is not a :class:`MicroHead` raises TypeError."""
    t0 = time.perf_counter()
    if not isinstance(head, MicroHead):
        raise TypeError(
            f"pipeline.schedule=1f1b needs a head with one exchange per micro-batch (begin_step / micro_step / "
            f"end_step: LocalHead, DecoderClient), not {type(head).__name__}"
        )
    step = _Step(stages, S, cu, micro)
    head.begin_step(micro, float(lr_factor))
    t_head = 0.0
    while True:
        step.submit_ready()
        if not any(step.queues):
            break
        i = step.waiting_for_head()
        z = to_host(stages.get(step.out[(i, S - 1)], S - 1))  # the head is across a wire
        start = time.perf_counter()
        step.head_grads[i] = head.micro_step(i, z)
        t_head += time.perf_counter() - start
    start = time.perf_counter()
    loss = head.end_step()
    t_head += time.perf_counter() - start
    t_loop = time.perf_counter()
    for i in reversed(range(len(micro))):  # the embedding's gradients summed in GPipe's order
        cu.backward(i, stages.get(step.back[(i, 0)], 0))
    t_end = time.perf_counter()
    return float(loss), {"forward": t_loop - t0 - t_head, "head": t_head, "backward": t_end - t_loop}
