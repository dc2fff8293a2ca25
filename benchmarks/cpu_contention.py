"""The machine's contention factor for the virtual clock: does a call's own CPU time grow when other processes
share the cores (issue 63)?

The virtual clock (``collapipe_flwr/pipeline/virtual_clock.py``) times every device call in CPU seconds of the
thread that ran it (``time.thread_time``), so that a device descheduled by a crowded host is not charged for the
wait. That holds only as far as a call's CPU seconds do not themselves grow with the crowd (shared caches, memory
bandwidth, a hyperthread sibling, a VM's stolen cycles counted as the guest's). This benchmark measures it: P
processes (one torch thread each, as device actors run) each run the same transformer_small TEB's forward +
backward (``models/transformer.EncoderBlock``, d_model 256, 8 x 64 tokens) ``--calls`` times, and the median
per-call CPU seconds at P = 2, 4, 8 are divided by the same at P = 1, timed in the same run in alternation
(P = 1, P = 2, P = 1, P = 4, ...). It prints ``name: value`` lines (``benchmarks/run_all.py`` reads them):

* ``contention_cpu_ratio_P<n>``: median per-call CPU seconds with n processes / alone (1.0 = the clock's
  assumption holds; the figure the virtual clock is off by on a host n deep);
* ``contention_wall_ratio_P<n>``: the same for wall seconds (about n / cores once n > cores: what the wall clock
  charges a device on a crowded host, and what the virtual clock does not).

``--precision``: ``fp32`` (the default, as first measured) or ``auto`` / ``bf16``: the call under the devices'
autocast as a run resolves it (``auto`` is bf16 on a CPU with AVX512-BF16/AMX, as the campaign's devices ran on the
Xeon). Usage: ``python benchmarks/cpu_contention.py [--calls 40] [--depths 2 4 8] [--repeats 2] [--precision fp32]``;
nothing else should run beside it (the 1-minute load average is printed before and after).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time


def _worker(calls: int, precision: str, barrier, out) -> None:
    import torch

    from collapipe_flwr.models.transformer import EncoderBlock
    from collapipe_flwr.precision import autocast

    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = EncoderBlock(256, 4, 512, 0.1).train()
    x = torch.randn(8, 64, 256)
    mask = torch.ones(8, 64, dtype=torch.long)

    def one() -> tuple[float, float]:
        leaf = x.detach().requires_grad_(True)
        wall, cpu = time.perf_counter(), time.thread_time()
        with autocast(precision):
            loss = block(leaf, mask).float().sum()
        loss.backward()
        block.zero_grad(set_to_none=True)
        return time.thread_time() - cpu, time.perf_counter() - wall

    for _ in range(3):  # warm-up, before the others start
        one()
    barrier.wait()
    out.put([one() for _ in range(calls)])


def at_depth(depth: int, calls: int, precision: str = "fp32") -> tuple[float, float]:
    """Median per-call (CPU, wall) seconds over ``depth`` processes running at once (``precision`` resolved)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(depth), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(calls, precision, barrier, out)) for _ in range(depth)]
    for p in procs:
        p.start()
    samples = [s for _ in procs for s in out.get(timeout=600)]
    for p in procs:
        p.join(timeout=60)
    return statistics.median(c for c, _ in samples), statistics.median(w for _, w in samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--precision", default="fp32", help="fp32 | bf16 | auto (the devices' autocast)")
    args = parser.parse_args(argv)
    from collapipe_flwr.precision import resolve_precision

    precision = str(resolve_precision(args.precision))
    print(f"cores: {os.cpu_count()}; precision: {precision}; load before: {os.getloadavg()[0]:.2f}", flush=True)
    cpu_ratio: dict[int, list[float]] = {d: [] for d in args.depths}
    wall_ratio: dict[int, list[float]] = {d: [] for d in args.depths}
    for _ in range(args.repeats):
        for depth in args.depths:
            alone_cpu, alone_wall = at_depth(1, args.calls, precision)
            cpu, wall = at_depth(depth, args.calls, precision)
            cpu_ratio[depth].append(cpu / alone_cpu)
            wall_ratio[depth].append(wall / alone_wall)
            print(
                f"P={depth}: cpu {cpu * 1e3:.2f} ms (alone {alone_cpu * 1e3:.2f}), wall {wall * 1e3:.2f} ms", flush=True
            )
    for depth in args.depths:
        print(f"contention_cpu_ratio_P{depth}: {statistics.median(cpu_ratio[depth]):.3f}")
        print(f"contention_wall_ratio_P{depth}: {statistics.median(wall_ratio[depth]):.3f}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
