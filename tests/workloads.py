"""Synthetic work for the planner's and the schedule's tests: encoder workloads with every block the same, and random
call times."""

from __future__ import annotations

from collapipe_flwr.system.workload import Workload


def uniform_workload(
    blocks: int, flops: float, boundary_bytes: float, param_bytes: float, saved_bytes: float, batch_size: int, **extra
) -> Workload:
    """``blocks`` equal blocks: ``flops`` forward FLOPs per sample and block, twice that backward, ``boundary_bytes``
    at each of the blocks + 1 boundaries, ``param_bytes`` and ``saved_bytes`` per block; ``extra``: Workload's other
    fields."""
    return Workload(
        forward_flops=(flops,) * blocks,
        backward_flops=(2 * flops,) * blocks,
        boundary_bytes=(boundary_bytes,) * (blocks + 1),
        param_bytes=(param_bytes,) * blocks,
        saved_bytes=(saved_bytes,) * blocks,
        batch_size=batch_size,
        **extra,
    )


# a compute-heavy encoder (6 blocks, 2 GFLOP per sample and block forward), so more stages cut the delay
COMPUTE_HEAVY = uniform_workload(6, 2e9, 4e3, 1e5, 1e4, 16)


def random_call_times(rng, S: int, m: int) -> tuple[list[list[float]], list[list[float]]]:
    """(forward, backward): seconds of each call [micro-batch i][stage k], drawn from ``rng`` (a random.Random)
    uniformly in [0.01, 1], forwards first."""
    forward = [[rng.uniform(0.01, 1.0) for _ in range(S)] for _ in range(m)]
    backward = [[rng.uniform(0.01, 1.0) for _ in range(S)] for _ in range(m)]
    return forward, backward
