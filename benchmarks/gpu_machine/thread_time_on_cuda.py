"""What a thread's CPU seconds say about a GPU call: the reason ``clock=virtual`` keeps every role on the CPU.

The virtual clock (``pipeline/virtual_clock.py``) times each device call by the CPU seconds of the thread that ran
it (``time.thread_time``) and scales them by the host's CPU FLOP rate (``pipeline/profiling.host_flop_rate``) over
the device's. A call on a GPU queues kernels and returns; its thread then waits in ``torch.cuda.synchronize``, and
whether that wait burns CPU seconds depends on CUDA's scheduling mode (spin, yield or block), not on the work.
This script measures, per micro-batch size, one bert_small-sized TEB's forward + backward on each side:

* on the GPU: wall seconds (``perf_counter`` around the call and its synchronize), CUDA-event seconds (the GPU's
  own time for the call) and the thread's CPU seconds over the same calls;
* on the CPU, one torch thread: wall and thread CPU seconds (what the virtual clock reads on a CPU host).

Pure torch, so it runs on a lent GPU machine without the project's dependencies. Usage (the device tool):
``PYTHONUNBUFFERED=1 python3 benchmarks/gpu_machine/thread_time_on_cuda.py --out $OUT/thread_time_on_cuda.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

HIDDEN, HEADS, D_FF, SEQ = 256, 4, 1024, 64  # conf/model/bert_small.yaml; 64 tokens (classification's titles)
SIZES = (1, 4, 16, 64)  # b_hat = ceil(b / m) for b = 64 and m = 64, 16, 4, 1
MIN_S = 0.5  # seconds of calls per size and side, after warm-up


def make_block(device: torch.device) -> nn.Module:
    layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, D_FF, dropout=0.1, batch_first=True)
    return layer.to(device).train()


def one_call(block: nn.Module, x: torch.Tensor) -> None:
    leaf = x.detach().requires_grad_(True)
    block(leaf).sum().backward()
    block.zero_grad(set_to_none=True)


def time_side(device: torch.device, size: int) -> dict[str, float]:
    """Mean seconds per call over at least ``MIN_S`` of calls: wall, thread CPU and (on a GPU) CUDA events."""
    block = make_block(device)
    x = torch.randn(size, SEQ, HIDDEN, device=device)
    cuda = device.type == "cuda"
    for _ in range(3):  # warm-up: kernels chosen, allocator filled
        one_call(block, x)
    if cuda:
        torch.cuda.synchronize(device)
    calls, wall, cpu, gpu = 0, 0.0, 0.0, 0.0
    while wall < MIN_S:
        start, cpu_start = time.perf_counter(), time.thread_time()
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        one_call(block, x)
        if cuda:
            end.record()
            torch.cuda.synchronize(device)
            gpu += begin.elapsed_time(end) / 1e3
        cpu += time.thread_time() - cpu_start
        wall += time.perf_counter() - start
        calls += 1
    row = {"size": size, "calls": calls, "wall_s": wall / calls, "thread_cpu_s": cpu / calls}
    if cuda:
        row["cuda_event_s"] = gpu / calls
    row["thread_cpu_over_wall"] = row["thread_cpu_s"] / row["wall_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON record goes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as clock=virtual's devices run (runtime.torch_threads=1)
    torch.manual_seed(0)
    record: dict[str, object] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "cpu_rows": [time_side(torch.device("cpu"), size) for size in SIZES],
    }
    if torch.cuda.is_available():
        record["cuda_rows"] = [time_side(torch.device("cuda", 0), size) for size in SIZES]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
