"""The CU's part of one training step: the embedding of each micro-batch, kept for its backward.

Both stage orders (``pipeline/gpipe.py``, ``pipeline/one_f_one_b.py``) embed micro-batch i on the CU when stage
0 first needs it and back-propagate dL/dz^0 of micro-batch i into the embedding once stage 0 returns it.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from collapipe_flwr.pipeline.dropout_seed import EMBEDDING, seed_block
from collapipe_flwr.precision import autocast


class CuEmbedding:
    """theta^emb on the CU for one step: :meth:`forward` per micro-batch, :meth:`backward` per micro-batch;
    ``seconds`` sums the embedding forwards (the ``seconds-step-embed`` metric)."""

    def __init__(self, embedding: nn.Module, precision: str, step_seed: int | None = None) -> None:
        self.embedding = embedding
        self.precision = precision
        self.step_seed = step_seed  # runtime.seeded_dropout: the embedding's masks from it (pipeline/dropout_seed.py)
        self.outputs: dict[int, torch.Tensor] = {}
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # this thread's CPU on the embedding's forwards and backwards (the virtual clock's)

    def forward(self, i: int, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """z^0 of micro-batch i, detached (stage 0's input); the graph is kept for :meth:`backward`."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        seed_block(self.step_seed, i, EMBEDDING)
        with autocast(self.precision):
            self.outputs[i] = self.embedding(micro_batch["input_ids"])
        self.seconds += time.perf_counter() - start
        self.cpu_seconds += time.thread_time() - cpu_start
        return self.outputs[i].detach()

    def backward(self, i: int, grad: torch.Tensor) -> None:
        """dL/dz^0 of micro-batch i into the embedding's gradients (nothing for a frozen embedding)."""
        cpu_start = time.thread_time()
        out = self.outputs.pop(i)
        if out.requires_grad:  # a frozen embedding (federation.embedding: frozen) has nothing to learn
            out.backward(grad.to(out.device))
        self.cpu_seconds += time.thread_time() - cpu_start
