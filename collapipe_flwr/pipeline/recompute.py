"""GPipe's re-materialization on a stage (``pipeline.checkpoint``, torchgpipe's ``checkpoint`` option): what a stage
keeps of a checkpointed micro-batch between its forward and its backward, and how it runs the segment again.

A checkpointed micro-batch's forward runs as a plain one (grad mode on, so every kernel is the one a kept forward
runs and its output is the same, bit for bit) inside :func:`saved_dropped`, whose pack hook keeps nothing of what
autograd would save: the graph holds no activation, and only the segment input z^s (the detached leaf) stays
until the backward. The backward runs the segment's forward again from that leaf, with the torch generators as the
forward found them (:class:`RngState`; with ``runtime.seeded_dropout`` the blocks reseed themselves as well), so
every dropout mask and every saved tensor is the forward's, then back-propagates through the recomputed graph.

Hand-written instead of ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: that runs the recompute
inside autograd's own ``saved_tensors_hooks`` (the recompute is triggered by the first unpack), so a
:class:`~collapipe_flwr.pipeline.memory.SavedTensorMeter` around the stage sees neither the forward's saved tensors
nor the recompute's transient activations, and the stage's ``peak_activation_bytes`` (C7's measured activation
term) would miss the backward's peak. The stage already splits forward and backward into two calls and keeps the
input leaf, so the recompute is simply the stage's own forward again, run under the meter in the backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


class _Dropped:
    """What :func:`saved_dropped` keeps of a saved tensor: nothing."""

    __slots__ = ()


def _drop(_tensor: torch.Tensor) -> _Dropped:
    return _Dropped()


def _refuse(_packed: _Dropped) -> torch.Tensor:
    raise RuntimeError("a checkpointed micro-batch's forward graph was back-propagated; its backward recomputes it")


@contextmanager
def saved_dropped() -> Iterator[None]:
    """Autograd builds its graph as usual inside, but keeps none of the tensors it would save for backward."""
    with torch.autograd.graph.saved_tensors_hooks(_drop, _refuse):
        yield


@dataclass(frozen=True)
class RngState:
    """The torch generator states a forward started from: the CPU's, and the stage device's on CUDA."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None
    device: torch.device

    @classmethod
    def capture(cls, device: torch.device) -> RngState:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), cuda, device)

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run inside with the generators as captured; afterwards they are as they were before (a recompute
        draws nothing from the process's generators, as a kept micro-batch's backward draws nothing)."""
        cuda = self.device.type == "cuda"
        index = self.device.index if self.device.index is not None else torch.cuda.current_device() if cuda else 0
        with torch.random.fork_rng(devices=[index] if cuda else [], device_type="cuda"):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


@dataclass
class Held:
    """What a stage keeps of micro-batch i between its forward and its backward: the detached input ``leaf`` z^s;
    ``out``, z^{s+1} with its graph (a kept micro-batch) or None (a checkpointed one, recomputed from ``leaf``
    with ``mask`` and ``rng``); ``saved``, the bytes held for it (SavedTensorMeter's count, or the leaf's)."""

    leaf: torch.Tensor
    out: torch.Tensor | None
    saved: int
    mask: torch.Tensor | None = None
    rng: RngState | None = None
