"""The stage orders of one training step: GPipe's clock cycles (paper Section III.D, Fig. 3) and 1F1B's.

GPipe: with S stages and m micro-batches the forward pass takes S + m - 1 clock cycles: in cycle t stage k
works on micro-batch i = t - k (so stage k runs micro-batch i while stage k+1 runs i-1). The backward
pass runs the same cycles in reverse. This is the (S + m - 1) factor of eq. (15). Every forward ends before
the first backward, so stage k holds the activations of all m micro-batches at once.

1F1B (``pipeline.schedule: 1f1b``): stage k runs min(S - k - 1, m) warm-up forwards, then alternates one
forward and one backward, then the cool-down backwards; it holds at most min(m, S - k) micro-batches'
activations (``system.pipeline_model.held_micro_batches``, C7's activation term). It needs dL/dz_enc of
micro-batch i before micro-batch i + S - k has gone forward on stage k, i.e. one head exchange per micro-batch.
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


def one_f_one_b_order(k: int, S: int, m: int) -> list[tuple[str, int]]:
    """Stage k's calls ("F" | "B", micro-batch i) in 1F1B order: min(S - k - 1, m) warm-up forwards, then
    one forward / one backward, then the cool-down backwards. Backwards run in ascending i on every stage."""
    if m < 1 or S < 1 or not 0 <= k < S:
        raise ValueError(f"need m >= 1, S >= 1 and 0 <= k < S, got m={m}, S={S}, k={k}")
    warm = min(S - k - 1, m)
    ops = [("F", i) for i in range(warm)]
    for j in range(m - warm):
        ops += [("F", warm + j), ("B", j)]
    return ops + [("B", i) for i in range(m - warm, m)]


def gpipe_critical_path_s(forward_s: list[list[float]], backward_s: list[list[float]]) -> float:
    """Seconds from stage 0's first forward to stage 0's last backward when every call takes the time given and
    hand-overs take none: the GPipe step's compute-bound critical path (what eq. (15)'s (S + m - 1) clock cycles
    become with unequal stages and micro-batches).

    ``forward_s[i][k]`` / ``backward_s[i][k]``: stage k's call on micro-batch i. Each stage runs its calls in the
    clock order (forwards in ascending i, backwards in descending i, :func:`backward_cycles`); stage k's forward of
    i waits for stage k-1's, its backward of i for stage k+1's, and the first backward for the last forward (the
    head in between is not counted). With every forward f and backward b this is (S + m - 1)(f + b).
    """
    m, S = len(forward_s), len(forward_s[0]) if forward_s else 0
    if m < 1 or S < 1 or any(len(row) != S for row in (*forward_s, *backward_s)) or len(backward_s) != m:
        raise ValueError(f"need m x S call times for both passes, got {len(forward_s)} and {len(backward_s)} rows")
    done = [0.0] * S  # when stage k finished its latest call
    for i in range(m):
        for k in range(S):
            done[k] = max(done[k], done[k - 1] if k else 0.0) + forward_s[i][k]
    start = max(done)  # the head needs every micro-batch's z^enc
    done = [start] * S
    for i in reversed(range(m)):
        for k in reversed(range(S)):
            done[k] = max(done[k], done[k + 1] if k < S - 1 else start) + backward_s[i][k]
    return max(done)
