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

from collapipe_flwr.system.pipeline_model import Schedule


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


def stage_orders(S: int, m: int, schedule: str = "gpipe") -> list[list[tuple[str, int]]]:
    """Each stage's calls ("F" | "B", micro-batch i) in the order it runs them: GPipe's forwards in ascending i
    then backwards in descending i (:func:`backward_cycles`), or 1F1B's (:func:`one_f_one_b_order`)."""
    if schedule == Schedule.GPIPE:
        return [[("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))] for _ in range(S)]
    if schedule == Schedule.ONE_F_ONE_B:
        return [one_f_one_b_order(k, S, m) for k in range(S)]
    raise ValueError(f"unknown pipeline schedule {schedule!r}; use gpipe or 1f1b")


def stage_order_critical_path_s(
    forward_s: list[list[float]],
    backward_s: list[list[float]],
    schedule: str = "gpipe",
    tail_s: list[float] | None = None,
) -> float:
    """Seconds from stage 0's first forward until every stage has run its calls (and its ``tail_s[k]``, the
    update behind its last backward) when every call takes the time given and nothing else waits: the step's
    critical path over the stages' call orders (:func:`stage_orders`).

    ``forward_s[i][k]`` / ``backward_s[i][k]``: stage k's call on micro-batch i. Stage k runs its calls in its
    order; its forward of i waits for stage k-1's forward of i, its backward of i for stage k+1's. The last
    stage's backward of i waits for the head: under GPipe for every micro-batch's z^enc (its last forward), under
    1F1B for micro-batch i's (the head itself takes no time here). With every forward f and backward b both give
    (S + m - 1)(f + b), eq. (15)'s clock cycles."""
    m, S = len(forward_s), len(forward_s[0]) if forward_s else 0
    if m < 1 or S < 1 or any(len(row) != S for row in (*forward_s, *backward_s)) or len(backward_s) != m:
        raise ValueError(f"need m x S call times for both passes, got {len(forward_s)} and {len(backward_s)} rows")
    tail = list(tail_s) if tail_s is not None else [0.0] * S
    if len(tail) != S:
        raise ValueError(f"need one tail per stage, got {len(tail)} for S={S}")
    orders = stage_orders(S, m, schedule)
    ended: dict[tuple[str, int, int], float] = {}  # (kind, i, k) -> when the call ended
    free = [0.0] * S  # when stage k finished its latest call
    at = [0] * S  # the index of stage k's next call in its order
    head_waits = (lambda i: ("F", m - 1, S - 1)) if schedule == Schedule.GPIPE else (lambda i: ("F", i, S - 1))
    while any(at[k] < len(orders[k]) for k in range(S)):
        progressed = False
        for k in range(S):
            while at[k] < len(orders[k]):
                kind, i = orders[k][at[k]]
                if kind == "F":
                    needs = ("F", i, k - 1) if k else None
                else:
                    needs = ("B", i, k + 1) if k < S - 1 else head_waits(i)
                if needs is not None and needs not in ended:
                    break
                start = max(free[k], ended[needs] if needs is not None else 0.0)
                free[k] = start + (forward_s[i][k] if kind == "F" else backward_s[i][k])
                ended[(kind, i, k)] = free[k]
                at[k] += 1
                progressed = True
        if not progressed:  # cannot happen for the two orders above; a guard against an order that waits on itself
            raise RuntimeError(f"the {schedule} stage orders deadlock at calls {at}")
    return max(free[k] + tail[k] for k in range(S))


def gpipe_critical_path_s(forward_s: list[list[float]], backward_s: list[list[float]]) -> float:
    """Seconds from stage 0's first forward to stage 0's last backward when every call takes the time given and
    hand-overs take none: the GPipe step's compute-bound critical path (what eq. (15)'s (S + m - 1) clock cycles
    become with unequal stages and micro-batches); :func:`stage_order_critical_path_s` in the GPipe order.

    ``forward_s[i][k]`` / ``backward_s[i][k]``: stage k's call on micro-batch i. Each stage runs its calls in the
    clock order (forwards in ascending i, backwards in descending i, :func:`backward_cycles`); stage k's forward of
    i waits for stage k-1's, its backward of i for stage k+1's, and the first backward for the last forward (the
    head in between is not counted). With every forward f and backward b this is (S + m - 1)(f + b).
    """
    return stage_order_critical_path_s(forward_s, backward_s, "gpipe")
