"""A pipelined step against what its own compute allows, and GPipe's S = 2 limit with contending calls."""

from __future__ import annotations

from collapipe_flwr.pipeline.schedule import gpipe_critical_path_s


def step_bound(traces: list[list[tuple[str, int, float, float]]], timings, s1_compute_s: float) -> dict[str, float]:
    """One pipelined step against what its own compute allows (issue 48: where the time between stages goes).

    From the devices' traces of the step (``ClusterPipeline.traces``: each call's wall start and end), each forward's
    and backward's seconds per (micro-batch i, stage k) give the GPipe critical path with hand-overs that take no
    time (``schedule.gpipe_critical_path_s``); ``bound_s`` adds the CU's own embed, head and update phases. Then
    ``over_bound`` = the measured step / bound_s: what the hand-overs, Ray's calls and the CU's work outside those
    phases cost (1 = none). ``microbatch_inflation`` = the S devices' compute this step / ``s1_compute_s`` (the
    whole batch through every block on one device, S = 1, m = 1): what the m micro-batches cost in compute together
    with the devices sharing the cores with the CU and Ray in the step (GPipe's bound (m + S - 1) / (S m) assumes 1;
    docs/benchmarks.md measures the two apart)."""
    m = 1 + max(i for calls in traces for _, i, _, _ in calls)
    forward = [[0.0] * len(traces) for _ in range(m)]
    backward = [[0.0] * len(traces) for _ in range(m)]
    for k, calls in enumerate(traces):
        for kind, i, start, end in calls:
            (forward if kind == "F" else backward)[i][k] += end - start
    critical = gpipe_critical_path_s(forward, backward)
    bound = critical + timings.embed + timings.head + timings.update
    compute = sum(map(sum, forward)) + sum(map(sum, backward))
    return {
        "critical_path_s": critical,
        "bound_s": bound,
        "over_bound": timings.total / bound,
        "microbatch_inflation": compute / s1_compute_s,
    }


def gpipe_limit_S2(m: int, pair_slowdown: float) -> float:
    """S = 2's GPipe step over S = 1, m = 1's when every call of the two stages takes the same time alone and
    ``pair_slowdown`` (c) times as long while the other stage computes too: each pass has one slot with stage 0
    alone, m - 1 with both, one with stage 1 alone, so (2 + (m - 1) c) / (2 m); c = 1 gives GPipe's (m + 1) / (2 m)
    (0.625 at m = 4)."""
    return (2 + (m - 1) * pair_slowdown) / (2 * m)
