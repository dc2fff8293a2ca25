"""One training step of a cluster on the CU (:class:`ClusterStep`, behind ``ClusterPipeline.train_step``; paper
Section III.B steps 3-6, Fig. 2, Algorithm 1 lines 5-22):

1. split the batch b into m micro-batches of b_hat = b/m (eq. (5)); a batch shorter than m (a partition's last
   of an epoch) into one-sample micro-batches;
2. forward, head and backward in the runtime's ``schedule``: ``gpipe`` (``pipeline/gpipe.py``: every forward in
   the GPipe clock order, one head call on all m z^enc, every backward; a stage holds m micro-batches) or
   ``1f1b`` (``pipeline/one_f_one_b.py``: one head exchange per micro-batch, stage k holds min(m, S - k));
   either way explicit loss scaling (each micro-batch's loss SUM over the whole batch's target count), so the
   step loss and every gradient equal the plain model's mean loss;
3. every segment and the embedding take one optimizer step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from collapipe_flwr.pipeline.cu_embedding import CuEmbedding
from collapipe_flwr.pipeline.executors import Stages
from collapipe_flwr.pipeline.gpipe import gpipe_step
from collapipe_flwr.pipeline.head import HeadFn, LocalHead, MicroHead
from collapipe_flwr.pipeline.microbatch import batch_size, split_batch
from collapipe_flwr.pipeline.one_f_one_b import one_f_one_b_step
from collapipe_flwr.pipeline.optim import OptimizerSpec, scale_lr
from collapipe_flwr.pipeline.placement import ClusterPlacement
from collapipe_flwr.pipeline.sparse_embedding import densify_gradients, use_sparse_gradients
from collapipe_flwr.pipeline.timings import StageSeconds, StepResult, StepTimings
from collapipe_flwr.system.pipeline_model import Schedule


def gather(stages: Stages, S: int, submit: Callable[[int], Any]) -> list:
    """``submit(s)`` on each of the S stages as one new batch of calls (a failure names the first not done), then
    every answer, in stage order."""
    stages.new_step()
    handles = [submit(s) for s in range(S)]
    return [stages.get(h, s) for s, h in enumerate(handles)]


class ClusterStep:
    """The CU's embedding with its optimizer, and the step (module docstring) over a placement's stages in the
    runtime's ``schedule``; ``precision``: the embedding's, on the CU's CPU."""

    def __init__(self, embedding: nn.Module, optimizer: OptimizerSpec, precision: str, schedule: Schedule) -> None:
        self.embedding = embedding
        self.optimizer_spec = optimizer
        self.precision = precision
        self.schedule = schedule
        use_sparse_gradients(embedding)  # m micro-batches' backwards touch only their rows (sparse_embedding.py)
        self.reset_optimizer()

    def reset_optimizer(self) -> None:
        """Fresh optimizer state for the embedding."""
        self.embedding_optimizer = self.optimizer_spec.build(self.embedding.parameters())
        self._embedding_base_lrs = [g["lr"] for g in self.embedding_optimizer.param_groups]

    def train_step(
        self,
        placement: ClusterPlacement,
        batch: dict[str, torch.Tensor],
        m: int,
        head: HeadFn | MicroHead,
        lr_factor: float = 1.0,
        step_seed: int | None = None,
    ) -> StepResult:
        """One step on ``placement``'s stages (``ClusterPipeline.train_step``)."""
        t0 = time.perf_counter()
        head_cpu0 = head.cpu_seconds if isinstance(head, LocalHead) else 0.0
        b = batch_size(batch)
        micro = split_batch(batch, m)
        m = len(micro)  # min(m, b): a short batch (an epoch's last) runs in fewer micro-batches
        placement.check_memory(b, int(batch["input_ids"].shape[1]), m)
        self._begin_step(placement, step_seed, m)
        cu = CuEmbedding(self.embedding, self.precision, step_seed)
        updates = None  # GPipe submits each stage's update behind its backward (pipeline/gpipe.py)
        if self.schedule == Schedule.ONE_F_ONE_B:
            loss, phases = one_f_one_b_step(placement.stages, placement.S, cu, micro, head, lr_factor)
        else:
            loss, phases, updates = gpipe_step(placement.stages, placement.S, cu, micro, head, lr_factor)
        t_bwd = time.perf_counter()
        stage_seconds, update_cpu = self._update(placement, lr_factor, updates)
        t_end = time.perf_counter()
        ks = [int(k) for k, _, _ in placement.bounds]
        timings = StepTimings(
            embed=cu.seconds,
            forward=t_bwd - t0 - phases["head"] - phases["backward"],
            head=phases["head"],
            backward=phases["backward"],
            update=t_end - t_bwd,
            total=t_end - t0,
            device_compute={int(k): float(c.compute) for (k, _, _), c in zip(placement.bounds, stage_seconds)},
            device_link={int(k): float(c.link) for (k, _, _), c in zip(placement.bounds, stage_seconds)},
            device_cpu={int(k): float(c.cpu) for (k, _, _), c in zip(placement.bounds, stage_seconds)},
            device_calls={k: tuple(c.calls) for k, c in zip(ks, stage_seconds)},
            cu_cpu=cu.cpu_seconds + update_cpu,
            head_cpu=(head.cpu_seconds - head_cpu0) if isinstance(head, LocalHead) else 0.0,
        )
        count = int((batch["labels"] != -100).sum()) if "labels" in batch else b
        return StepResult(loss=float(loss), count=count, timings=timings)

    def _begin_step(self, placement: ClusterPlacement, step_seed: int | None, m: int) -> None:
        self.embedding.train()
        self.embedding_optimizer.zero_grad(set_to_none=True)
        stages = placement.stages
        gather(stages, placement.S, lambda s: stages.submit_begin_step(s, step_seed, m))

    def _update(
        self, placement: ClusterPlacement, lr_factor: float, submitted: list | None = None
    ) -> tuple[list[StageSeconds], float]:
        """Every segment and the embedding take one optimizer step (the segments' already ``submitted``, or now);
        returns each stage's compute and D2D link seconds and the CPU seconds of the embedding's update."""
        stages = placement.stages
        steps = submitted
        if steps is None:
            steps = [stages.submit_step(s, float(lr_factor)) for s in range(placement.S)]
        cpu_start = time.thread_time()
        densify_gradients(self.embedding)
        scale_lr(self.embedding_optimizer, self._embedding_base_lrs, lr_factor)
        self.embedding_optimizer.step()
        self.embedding_optimizer.zero_grad(set_to_none=True)
        update_cpu = time.thread_time() - cpu_start
        return [stages.get(h, s) for s, h in enumerate(steps)], update_cpu
