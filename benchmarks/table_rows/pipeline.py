"""The pipeline's rows: ``pipeline_overhead.py``'s step figures and ``pipeline_1f1b_memory.py``'s memory."""

from __future__ import annotations

from table_rows.row import Row, figure_named

PIPE_S, PIPE_M = (1, 2, 3), (1, 2, 4, 8)
DEVICE_CORES = 0.7  # each device's CPU quota in the quota speed-up row (pipeline_overhead.py --device-cores)


# (the figure, its printed name, its target or None) of pipeline_overhead.py, all ratios ("x")
PIPELINE_FIGURES = (
    (
        "framework overhead: S = 1, m = 1, one core, vs the plain model on one core, paired step by step, median of "
        "5 runs",
        "overhead_ratio_equal_cores_paired_median_of_runs",
        1.05,  # issue 64: the median of at least five runs of the paired ratio (issue 48's was one run's medians)
    ),
    (
        "framework overhead: S = 1, m = 1, one core, vs the plain model on one core",
        "overhead_ratio_equal_cores",
        None,
    ),
    (
        "pipeline speed-up: S = 2, m = 4, one core per device, vs S = 1, m = 1 on one core",
        "device_speedup_S2_m4",
        0.68,  # issue 48 (was 0.75): GPipe's bubble gives (m + S - 1) / (S m) = 0.625
    ),
    (
        "the framework overhead step by step (each S = 1, m = 1 step over the plain step beside it), median",
        "overhead_ratio_equal_cores_paired",
        None,
    ),
    (
        "the S = 2, m = 4 speed-up step by step (each step over the S = 1, m = 1 step beside it), median",
        "device_speedup_S2_m4_paired",
        None,
    ),
    (
        f"pipeline speed-up: S = 2, m = 4, devices of {DEVICE_CORES:g} core each (cgroup CPU quota), vs one such "
        "device",
        "device_speedup_S2_m4_quota",
        0.75,
    ),
    (
        "the same speed-up with tensors through Ray's object store (runtime.handoff=object_store), same run",
        "device_speedup_S2_m4_object_store",
        None,
    ),
    (
        "the speed-up S = 2, m = 4's measured calls allow (their critical path with free hand-overs, plus the "
        "CU's phases), vs S = 1, m = 1",
        "device_speedup_S2_m4_bound",
        None,
    ),
    (
        "S = 2, m = 4: the step over that bound (hand-overs, Ray's calls, the CU's other work)",
        "fair_S2_m4_over_bound",
        None,
    ),
    (
        "S = 2, m = 4: the devices' compute over S = 1, m = 1's (micro-batches, cores shared with the CU and Ray)",
        "fair_S2_m4_microbatch_inflation",
        None,
    ),
    (
        "machine: one device's work of S = 2, m = 4 on two pinned cores at once, vs alone (1 = independent cores)",
        "machine_pair_slowdown",
        None,
    ),
    (
        "GPipe's S = 2, m = 4 limit at that slowdown, vs S = 1, m = 1 (modelled from the measured slowdown)",
        "gpipe_limit_S2_m4_at_pair_slowdown",
        None,
    ),
    ("pipeline step, S = 2, m = 4, vs the plain model", "step_ratio_S2_m4", None),
)


def pipeline_rows(pipe_args: str) -> list[Row]:
    """The two fair figures against their targets (equal cores: the framework's own cost; one core per device: what
    S = 2 devices buy over one), then S = 2, m = 4 against the plain model on all cores and the whole (S, m) grid
    for context, as the ratio of the fastest steps (a burst of load from another job moves a median of 5 far
    more)."""
    command = f"python benchmarks/pipeline_overhead.py {pipe_args}"
    out = [Row(label, figure_named(name), "x", target, command) for label, name, target in PIPELINE_FIGURES]
    for S in PIPE_S:
        for m in PIPE_M:
            name = f"pipeline step, S = {S}, m = {m}, vs the plain model, fastest steps"
            out.append(Row(name, figure_named(f"step_ratio_fastest_S{S}_m{m}"), "x", None, command))
    return out


def schedule_memory_rows(mem_args: str) -> list[Row]:
    """Peak per-stage memory of 1F1B against GPipe: the shipped ``pipeline.schedule: 1f1b`` (activations, with its
    target, and its gradients against GPipe's), then the hand-driven orders with the head called once per step and
    once per micro-batch (params + Adam state + activations)."""
    command = f"python benchmarks/pipeline_1f1b_memory.py {mem_args}"
    return [
        Row(
            "pipeline.schedule=1f1b, per-stage peak activation memory vs gpipe, S = 2, m = 8",
            figure_named("shipped_act_ratio_1f1b_vs_gpipe_S2_m8"),
            "x",
            0.5,
            command,
        ),
        Row(
            "pipeline.schedule=1f1b, largest relative gradient difference vs gpipe (fp32), S = 2, m = 8",
            figure_named("shipped_max_grad_rel_diff_1f1b_S2_m8"),
            "",
            1e-5,
            command,
        ),
        *(
            Row(
                f"1F1B peak memory per stage vs GPipe, S = {S}, m = 8, {how}",
                figure_named(f"peak_ratio_{order}_vs_gpipe_S{S}_m8"),
                "x",
                None,
                command,
            )
            for S in (2, 3)
            for order, how in (("1f1b_head_once", "head once per step"), ("1f1b", "head per micro-batch"))
        ),
    ]
