"""How many torch threads the server's process computes with (``runtime.server_threads``).

In a simulation the server's decoder / head shares the machine's cores with the device actors, which Ray runs
at a lower priority (nice 15). A head on every core then wins each core it asks for and the pipeline's stages
wait: on the 2-core machine of benchmarks/server_threads.py a 2-thread head ran 26-34% faster than a 1-thread one
while an encoder stage beside it fell to 5-9% of its speed. So the rounds train with ``server_threads`` (1 by
default; 0 leaves torch's default, every core, for a server on its own machine) and the evaluation between
rounds, when no CU trains, takes every usable core.

torch's thread count is per process, and each thread applies it when it first computes, so the count is set
before the decoder's first step of the run and restored when the rounds end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` inside (0 leaves it as it is), the previous count after."""
    before = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(int(count))
    try:
        yield
    finally:
        if count > 0:
            torch.set_num_threads(before)
