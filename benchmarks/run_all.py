"""Every benchmark in one command, one table: each figure with its target, whether it is met, and the
command that measures it alone.

    python benchmarks/run_all.py            # about 15 minutes on 2 idle cores (scaling.py: ~3, HF: ~5)
    python benchmarks/run_all.py --quick    # fewer steps and rounds (a smoke check of the table), ~4 minutes

Runs ``pipeline_overhead.py`` (S = 1, 2, 3 x m = 1, 2, 4, 8), ``pipeline_1f1b_memory.py`` (S = 2, 3,
m = 8), ``data_plane.py`` (no Flower comparison), ``dssra_solve.py`` (the target sizes), ``optimizer_step.py``
(the fused Adam kernel's gain on each task's model), ``cpu_contention.py`` (a call's CPU seconds with 2-8 processes
at once against alone: the virtual clock's assumption), ``scaling.py``
(round wall-clock, eq. (26) and server memory vs N and K), ``gpu_speedup.py`` (GPU vs CPU; only
``cuda_available: 0`` on a machine without CUDA) and ``hf_pipeline_memory.py`` (GPT-2 small's shape through the
pipeline: per-device memory with and without LoRA, step time vs the un-split model) as subprocesses, reads their
``name: value`` lines and prints the machine it ran on and a Markdown table. Figures that no benchmark measures
yet are listed as such, so the table says plainly what is missing. Ratios are taken within one run (this machine
may be shared); the 1-minute load average before and after is printed so a busy run can be recognised.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # table_rows/ beside this script, also when loaded by path
    sys.path.insert(0, str(HERE))

from table_rows.compute import contention_rows, gpu_rows, hf_rows, optimizer_rows  # noqa: E402
from table_rows.data_plane import data_plane_rows  # noqa: E402
from table_rows.pipeline import DEVICE_CORES, pipeline_rows, schedule_memory_rows  # noqa: E402
from table_rows.row import Figures, Row  # noqa: E402
from table_rows.scale import dssra_rows, scaling_rows  # noqa: E402


def parse_figures(text: str) -> Figures:
    """``name: number`` lines of a benchmark's stdout (other lines ignored)."""
    out: Figures = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        try:
            out[name.strip()] = float(value.strip().split()[0])
        except (ValueError, IndexError):
            continue
    return out


def run_benchmark(script: str, args: list[str], timeout_s: float) -> tuple[Figures, str]:
    """The figures of one benchmark, and '' or why it gave none (failed, timed out)."""
    cmd = [sys.executable, str(HERE / script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        return {}, f"{script} ran past {timeout_s:.0f} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return parse_figures(proc.stdout), f"{script} failed: {last}"
    return parse_figures(proc.stdout), ""


def rows(
    dp_args: str, pipe_args: str, dssra_args: str, mem_args: str = "", scale_args: str = "", hf_args: str = ""
) -> list[Row]:
    """Every row of the table, in order: pipeline, 1F1B memory, data plane, DSSRA, optimizer, scaling, HF model,
    GPU."""
    return [
        *pipeline_rows(pipe_args),
        *schedule_memory_rows(mem_args),
        Row(
            "pipeline peak memory per device, S = 2, vs the plain model",
            lambda f: f["mem_ratio_S2"],
            "x",
            None,
            f"python benchmarks/pipeline_overhead.py {pipe_args}",
        ),
        *data_plane_rows(dp_args),
        *dssra_rows(dssra_args),
        *optimizer_rows(),
        *contention_rows(),
        *scaling_rows(scale_args),
        *hf_rows(hf_args),
        *gpu_rows(),
    ]


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{model}, {cores} cores, {gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds: a check of the table, not figures")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each benchmark may take")
    args = ap.parse_args(argv)
    pipe = f"--S 1 2 3 --m 1 2 4 8 --device-cores {DEVICE_CORES:g}" + (" --steps 2 --warmup 1" if args.quick else "")
    mem = "--S 2 3 --m 8"
    dp = "--skip-flower --steps " + ("20" if args.quick else "200")
    dssra = "--sizes 100,10,50 1000,10,200 --drifts gamma --rounds " + ("1" if args.quick else "2")
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    figures: Figures = {}
    problems = []
    gpu = "" if args.quick else "--round"
    scale = "--quick" if args.quick else ""
    hf = "--steps 1" if args.quick else ""
    benchmarks = [
        ("pipeline_overhead.py", pipe),
        ("pipeline_1f1b_memory.py", mem),
        ("data_plane.py", dp),
        ("dssra_solve.py", dssra),
        ("optimizer_step.py", "--steps 3" if args.quick else ""),
        ("cpu_contention.py", "--calls 10 --repeats 1" if args.quick else ""),
        ("gpu_speedup.py", gpu),
        ("scaling.py", scale),
        ("hf_pipeline_memory.py", hf),
    ]
    for script, extra in benchmarks:
        found, problem = run_benchmark(script, extra.split(), args.timeout)
        figures.update(found)
        if problem:
            problems.append(problem)
    print(f"machine: {machine()}")
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"took: {time.monotonic() - started:.0f} s{' (--quick)' if args.quick else ''}\n")
    table = [["figure", "value", "target", "met", "command"]] + [
        r.cells(figures) for r in rows(dp, pipe, dssra, mem, scale, hf)
    ]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for i, row in enumerate(table):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for problem in problems:
        print(f"\nerror: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
