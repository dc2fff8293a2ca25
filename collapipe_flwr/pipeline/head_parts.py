"""The head's side of a 1F1B step: the m micro-batches reach the head one at a time, the head updates once.

Under ``pipeline.schedule: 1f1b`` the last stage needs dL/dz_enc of micro-batch i before the later
micro-batches have gone forward, so the head runs one exchange per micro-batch. :class:`HeadParts` keeps what
makes the m exchanges equal GPipe's single call (:func:`~collapipe_flwr.pipeline.head.head_step`):

- explicit loss scaling with the WHOLE batch's target count C = sum_i c_i, known before any z_enc arrives
  (``TaskHead.target_count``, checked against the count ``loss_terms`` returns for each micro-batch), so
  micro-batch i back-propagates l_i / C exactly as in GPipe;
- the head's parameter gradients summed over the m micro-batches in its own buffers (in micro-batch order, as
  GPipe's backward accumulates them), never in ``p.grad`` until :meth:`HeadParts.apply` puts them there and
  takes the one optimizer step of the step (GPipe's synchronous update, Algorithm 1 line 14).

The same class runs in-process (``LocalHead``) and on the decoder host (``fl/server/decoder/frame_service.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from collapipe_flwr.accelerator import batch_to, module_device
from collapipe_flwr.models.split import TaskHead
from collapipe_flwr.pipeline.finite import all_finite


class HeadParts:
    """One step's m micro-batches on ``head``: :meth:`part` per micro-batch in order, then :meth:`apply` once.

    Raises ValueError (nothing applied to the head) on a batch without targets, a micro-batch out of order, a
    head whose ``target_count`` disagrees with its ``loss_terms``, or a loss / gradient that is not finite."""

    def __init__(self, head: TaskHead, micro_batches: Sequence[dict[str, torch.Tensor]]) -> None:
        self.head = head
        self.device = module_device(head)
        self.micro_batches = [batch_to(mb, self.device) for mb in micro_batches]
        self.counts = [int(head.target_count(mb["attention_mask"], mb)) for mb in self.micro_batches]
        self.total = torch.tensor([float(c) for c in self.counts], dtype=torch.float64).sum()  # C
        if not self.total > 0:
            raise ValueError("the batch has no targets (every label is -100); drop empty batches before training")
        self.params = [p for p in head.parameters() if p.requires_grad]
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)
        self.sums: list[float] = []

    @property
    def m(self) -> int:
        return len(self.micro_batches)

    @property
    def done(self) -> bool:
        """Every micro-batch has had its exchange."""
        return len(self.sums) == self.m

    def part(self, i: int, z_enc: torch.Tensor) -> torch.Tensor:
        """dL/dz_enc of micro-batch i (l_i / C back-propagated), its head gradients added to the step's sum;
        returned on the device ``z_enc`` came from."""
        if i != len(self.sums):
            raise ValueError(f"micro-batch {i} reached the head while micro-batch {len(self.sums)} was due")
        mb = self.micro_batches[i]
        leaf = z_enc.detach().to(self.device).requires_grad_(True)
        loss_sum, count = self.head.loss_terms(leaf, mb["attention_mask"], mb)
        if int(count) != self.counts[i]:
            raise ValueError(
                f"micro-batch {i}: the head's target_count gives {self.counts[i]} targets but loss_terms counts "
                f"{int(count)}; override TaskHead.target_count to count as loss_terms does"
            )
        grads = torch.autograd.grad(loss_sum / self.total.to(loss_sum.dtype), [leaf, *self.params], allow_unused=True)
        dz = grads[0] if grads[0] is not None else torch.zeros_like(leaf)
        value = float(loss_sum.detach())
        if not math.isfinite(value) or not all(g is None or all_finite(g) for g in grads):
            raise ValueError(
                f"micro-batch {i}'s loss or gradients are not finite (loss sum {value}); the head was not updated, "
                "check the activations this CU sends (too large, NaN) and its learning rate"
            )
        for j, g in enumerate(grads[1:]):
            if g is not None:
                held = self.grads[j]
                self.grads[j] = g if held is None else held + g
        self.sums.append(value)
        return dz.to(z_enc.device)

    def loss(self) -> float:
        """The step loss so far: sum_i l_i / C (the plain model's mean once every part is in)."""
        return float(sum(self.sums) / float(self.total))

    def apply(self, optimizer: torch.optim.Optimizer | None) -> float:
        """After the m parts: the summed gradients on the head's parameters and one optimizer step (none
        without an optimizer); returns the step loss."""
        if not self.done:
            raise ValueError(f"the head step ended after {len(self.sums)} of its {self.m} micro-batches")
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
            for p, g in zip(self.params, self.grads):
                p.grad = g
            optimizer.step()
        return self.loss()
