"""The GPipe clock-cycle schedule (paper Section III.D, Fig. 3).

With S stages and m micro-batches the forward pass takes S + m - 1 clock cycles: in cycle t stage k
works on micro-batch i = t - k (so stage k runs micro-batch i while stage k+1 runs i-1). The backward
pass runs the same cycles in reverse. This is the (S + m - 1) factor of eq. (15).
"""

from __future__ import annotations


def forward_cycles(m: int, S: int) -> list[list[tuple[int, int]]]:
    """Cycles t = 0..S+m-2, each the list of (micro-batch i, stage k) with i + k = t."""
    if m < 1 or S < 1:
        raise ValueError(f"need m >= 1 and S >= 1, got m={m}, S={S}")
    return [[(t - k, k) for k in range(S) if 0 <= t - k < m] for t in range(m + S - 1)]


def backward_cycles(m: int, S: int) -> list[list[tuple[int, int]]]:
    """The forward cycles mirrored: the last stage starts with the last micro-batch."""
    return [[(m - 1 - i, S - 1 - k) for i, k in cycle] for cycle in forward_cycles(m, S)]
