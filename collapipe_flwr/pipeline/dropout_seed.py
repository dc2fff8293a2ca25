"""Dropout masks that follow the run's seed and the step, not the way the step was cut (``runtime.seeded_dropout``).

Without it, each process draws its dropout masks from its own torch generator: a Ray device actor's is never
seeded by the run, a CU's depends on what ran in it before, and the server's decoder draws in the order the CUs'
steps arrive. Two runs with the same seed then differ from their first step, and two settings that compute the
same gradient (S, the split delta_k, the devices) differ by their masks. With it, the mask of encoder block l on
micro-batch i of step j of cluster n in round t is drawn right after seeding torch with
``block_seed(step_seed(seed, t, n, j), i, l)``: the same whichever device holds block l (any S, any delta_k), in
any process and on any backend. m still changes the masks (a micro-batch holds other rows), as it changes the
batch statistics. The CU's embedding is "block" :data:`EMBEDDING` and the server's head :data:`HEAD`, seeded per
(t, n, step id) under the head's lock, so its masks no longer follow the arrival order either.

Hand-written because no kept library derives a seed from a tuple: a BLAKE2b digest of the packed integers,
63 bits of it (torch.manual_seed takes any non-negative int below 2**64).
"""

from __future__ import annotations

import hashlib
import struct

import torch

EMBEDDING = -1  # the CU's embedding, before block 0
HEAD = -2  # the server's decoder / task head
_MASK = (1 << 63) - 1


def _mix(*values: int) -> int:
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK


def step_seed(run_seed: int, round_: int, cluster: int, step: int) -> int:
    """The seed of step j of cluster n in round t of a run seeded ``run_seed``."""
    return _mix(int(run_seed), int(round_), int(cluster), int(step))


def block_seed(step: int, micro_batch: int, block: int) -> int:
    """The seed of block l's masks on micro-batch i of the step seeded ``step``."""
    return _mix(int(step), int(micro_batch), int(block))


def seed_block(step: int | None, micro_batch: int, block: int) -> None:
    """Seed torch for block l on micro-batch i (nothing when the step is not seeded: ``step`` None)."""
    if step is not None:
        torch.manual_seed(block_seed(step, micro_batch, block))
