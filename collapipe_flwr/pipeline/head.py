"""The server-side part of one training step: head forward, loss, backward, head update.

The same :func:`head_step` runs in-process (:class:`LocalHead`, used by methods that keep the head on
the CU and by tests) and behind the data plane on the edge server, so both paths compute identical
numbers.

Loss scaling is explicit (docs/contracts.md): the head returns, per micro-batch i, the SUM of its
per-target losses l_i and its target count c_i. The step loss is sum_i l_i / sum_i c_i, exactly the
plain model's mean over the whole batch, and micro-batch i back-propagates l_i / C with C = sum_i c_i.

GPipe hands the head all m micro-batches of a step at once, so :func:`head_step` runs the head once over
each run of micro-batches it can stack (the same keys and shapes but the batch dimension: the m slices of
one padded batch), not once per micro-batch: a head's per-call cost (the CRF's loop over the positions,
the decoder's kernel launches) is then paid once a step, not m times, and the sums and gradients are the
per-micro-batch ones up to float rounding (every head's loss is a sum over rows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from collapipe_flwr.accelerator import batch_to, module_device
from collapipe_flwr.models.split import TaskHead
from collapipe_flwr.pipeline.finite import all_finite
from collapipe_flwr.pipeline.head_parts import HeadParts
from collapipe_flwr.pipeline.optim import OptimizerSpec, scale_lr
from collapipe_flwr.precision import autocast

# head(z_enc per micro-batch, the micro-batches, the step's lr factor) -> (loss, dL/dz_enc per micro-batch): the
# server's decoder over the data plane (fl/dataplane/client.py) or a head trained here (LocalHead)
HeadFn = Callable[[list[torch.Tensor], list[dict], float], tuple[float, list[torch.Tensor]]]


@runtime_checkable
class MicroHead(Protocol):
    """A head that also takes one step's micro-batches one at a time (``pipeline.schedule: 1f1b``):
    ``begin_step(micro_batches, lr_factor)``, then ``micro_step(i, z_enc_i) -> dL/dz_enc_i`` for i = 0..m-1 in
    order (micro-batch i's loss sum over the WHOLE batch's target count C), then ``end_step() -> loss``, which
    takes the head's one update of the step (``pipeline.head_parts.HeadParts``)."""

    def begin_step(self, micro_batches: list[dict], lr_factor: float = 1.0) -> None: ...

    def micro_step(self, i: int, z_enc: torch.Tensor) -> torch.Tensor: ...

    def end_step(self) -> float: ...


def stack_runs(
    z_enc: Sequence[torch.Tensor], micro_batches: Sequence[dict[str, torch.Tensor]], breaks: Sequence[int] = ()
) -> list[range]:
    """The runs of consecutive micro-batches the head can take in one call: the same batch keys, every value a
    tensor of the same trailing shape and dtype (only the batch dimension may differ), and the encoder outputs
    alike. A run never crosses an index in ``breaks`` (a new run starts there: a joint step's clusters)."""

    def layout(i: int) -> tuple | None:
        mb, z = micro_batches[i], z_enc[i]
        if z.dim() == 0 or not all(isinstance(v, torch.Tensor) and v.dim() > 0 for v in mb.values()):
            return None
        return (z.shape[1:], z.dtype, tuple((k, v.shape[1:], v.dtype) for k, v in sorted(mb.items())))

    layouts = [layout(i) for i in range(len(z_enc))]
    runs: list[range] = []
    start, cut = 0, set(breaks)
    for i in range(1, len(z_enc) + 1):
        if i == len(z_enc) or i in cut or layouts[start] is None or layouts[i] != layouts[start]:
            runs.append(range(start, i))
            start = i
    return runs


def _stacked(values: list, run: range) -> list:
    """One call's inputs for ``run``: the run's tensors, or dicts of tensors, concatenated on the batch dimension."""
    if len(run) == 1:
        return [values[run.start]]
    first = values[run.start]
    if isinstance(first, dict):
        return [{k: torch.cat([values[i][k] for i in run]) for k in first}]
    return [torch.cat([values[i] for i in run])]


def head_step(
    head: TaskHead,
    optimizer: torch.optim.Optimizer | None,
    z_enc: Sequence[torch.Tensor],
    micro_batches: Sequence[dict[str, torch.Tensor]],
    terms: list[tuple[float, float, int]] | None = None,
    breaks: Sequence[int] = (),
) -> tuple[float, list[torch.Tensor]]:
    """One step of the head over m micro-batches, in one head call per run of stackable micro-batches
    (:func:`stack_runs`; a run never crosses an index in ``breaks``).

    ``z_enc[i]`` is the encoder output of micro-batch i (leaf tensors; not modified). Returns the step
    loss (plain mean over all targets) and dL/dz_enc[i] for every i. When ``optimizer`` is given, the
    head's gradients are zeroed first and one optimizer step is taken after the backward (GPipe's
    synchronous update). ``terms`` (optional) receives (loss sum, target count, micro-batches) per run.

    The step is refused (ValueError, the head's weights and optimizer state untouched) unless the loss and
    every gradient are finite: one bad batch must not poison a decoder that every CU shares.

    The head computes on its own device (``runtime.server_device``): inputs are moved there and each
    gradient is returned on the device its ``z_enc[i]`` came from.
    """
    if len(z_enc) != len(micro_batches):
        raise ValueError(f"{len(z_enc)} encoder outputs for {len(micro_batches)} micro-batches")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    device = module_device(head)
    leaves = [z.detach().to(device).requires_grad_(True) for z in z_enc]
    micro_batches = [batch_to(mb, device) for mb in micro_batches]
    runs = stack_runs(leaves, micro_batches, breaks)
    sums, counts = [], []
    for run in runs:
        (z,), (mb,) = _stacked(leaves, run), _stacked(micro_batches, run)
        loss_sum, count = head.loss_terms(z, mb["attention_mask"], mb)
        sums.append(loss_sum)
        counts.append(count)
    total = torch.stack([torch.as_tensor(c, dtype=torch.float64) for c in counts]).sum()
    if not total > 0:
        raise ValueError("the batch has no targets (every label is -100); drop empty batches before training")
    denom = total.to(sums[0].dtype)
    for loss_sum in sums:
        (loss_sum / denom).backward()
    loss = float(sum(float(s.detach()) for s in sums) / float(total))
    grads = [(z.grad if z.grad is not None else torch.zeros_like(z)).to(src.device) for z, src in zip(leaves, z_enc)]
    if (
        not math.isfinite(loss)
        or not all(all_finite(g) for g in grads)
        or not all(p.grad is None or all_finite(p.grad) for p in head.parameters())
    ):
        head.zero_grad(set_to_none=True)
        raise ValueError(
            f"the step's loss or gradients are not finite (loss {loss}); the head was not updated, "
            "check the activations this CU sends (too large, NaN) and its learning rate"
        )
    if optimizer is not None:
        optimizer.step()
    if terms is not None:
        terms.extend((float(s.detach()), float(c), len(r)) for s, c, r in zip(sums, counts, runs))
    return loss, grads


class LocalHead:
    """A :data:`HeadFn` that trains the head in this process (``head(z_list, mbs, lr_factor) -> (loss, grads)``)."""

    def __init__(self, head: TaskHead, optimizer: OptimizerSpec | None, precision: str = "fp32") -> None:
        self.head = head
        self.precision = precision
        self.spec = optimizer
        self._parts: HeadParts | None = None
        self.cpu_seconds = 0.0  # this thread's CPU on the head's steps so far (the virtual clock's head_cpu)
        self.reset_optimizer()

    def reset_optimizer(self) -> None:
        self.optimizer = self.spec.build(self.head.parameters()) if self.spec is not None else None
        self._base_lrs = [g["lr"] for g in self.optimizer.param_groups] if self.optimizer is not None else []

    def __call__(self, z_enc, micro_batches, lr_factor: float = 1.0):
        start = time.thread_time()
        self.head.train()
        if self.optimizer is not None:
            scale_lr(self.optimizer, self._base_lrs, lr_factor)
        try:
            with autocast(self.precision, module_device(self.head).type):
                return head_step(self.head, self.optimizer, z_enc, micro_batches)
        finally:
            self.cpu_seconds += time.thread_time() - start

    # -- one micro-batch at a time (MicroHead, pipeline.schedule: 1f1b) -------------------------------
    def begin_step(self, micro_batches: list[dict], lr_factor: float = 1.0) -> None:
        self.head.train()
        if self.optimizer is not None:
            scale_lr(self.optimizer, self._base_lrs, lr_factor)
        self._parts = HeadParts(self.head, micro_batches)

    def micro_step(self, i: int, z_enc: torch.Tensor) -> torch.Tensor:
        if self._parts is None:
            raise ValueError("micro_step before begin_step; a 1F1B step starts with begin_step(micro_batches)")
        start = time.thread_time()
        try:
            with autocast(self.precision, module_device(self.head).type):
                return self._parts.part(i, z_enc)
        finally:
            self.cpu_seconds += time.thread_time() - start

    def end_step(self) -> float:
        parts, self._parts = self._parts, None
        if parts is None:
            raise ValueError("end_step without begin_step")
        start = time.thread_time()
        try:
            return parts.apply(self.optimizer)
        finally:
            self.cpu_seconds += time.thread_time() - start

    def close(self) -> None:
        pass
