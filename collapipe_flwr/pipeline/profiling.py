"""Measuring a device where it runs: one TEB's forward + backward time per micro-batch size, the memory the
device may use, and activation-sized transfers on the pipeline's own transport (system/profile.py fits them).

These functions run inside the device's process (a Ray actor, or the CU's process on the local backend), so
what they time is what the stage pays: its cores (a cgroup CPU quota on the testbed), its torch threads, an
emulated slowdown, its link throttle.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import torch
from torch import nn

from collapipe_flwr.precision import autocast
from collapipe_flwr.testbed.memory_limit import own_memory_limit

WINDOW_S = 0.06  # one timing window: six periods of the testbed's 10 ms CFS quota period
# the cgroup v1 / v2 files that may cap this process's memory below the host's
_MEMORY_LIMIT_FILES = ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max")


def candidate_sizes(batch_size: int, count: int = 3) -> list[int]:
    """The micro-batch sizes b_hat = ceil(b / m) to time: spread over 1..b (Sub-1 may choose any m), distinct."""
    b = max(1, int(batch_size))
    sizes = {b, max(1, b // 4), max(1, b // 16)} if count >= 3 else {b, max(1, b // 4)}
    if len(sizes) < 2:
        sizes = {1, 2}
    return sorted(sizes)


def time_block(
    block: nn.Module,
    sizes: Sequence[int],
    seq_len: int,
    width: int,
    repeats: int = 5,
    device: torch.device | None = None,
    precision: str = "fp32",
    after_each: Callable[[float], float] | None = None,
) -> list[float]:
    """Seconds of one forward + backward of ``block`` on a [b_hat, seq_len, width] micro-batch, per size.

    Calls run back to back in ``repeats`` windows of at least ``WINDOW_S`` each; a size's figure is the median
    of the windows' mean call times. A window's mean spans several periods of a CFS CPU quota (the testbed's
    period is 10 ms), which lets a short burst through at full speed and throttles the rest of its period, so
    it is the rate the device trains at (a minimum or median of single short calls would miss the quota); the
    median over windows leaves out a window in which another process took the core.
    ``block`` is copied (the caller's weights get no gradients); one untimed call per size warms the kernels.
    ``after_each(elapsed) -> extra`` is called after every timed call with its seconds and returns what it added
    (the stage's emulated slowdown sleeps there), so the timing is what a real chunk of this stage costs."""
    device = device or torch.device("cpu")
    work = copy.deepcopy(block).to(device).train()
    dtype = next((p.dtype for p in work.parameters() if p.is_floating_point()), torch.float32)
    out: list[float] = []
    for b_hat in sizes:
        x = torch.randn(int(b_hat), int(seq_len), int(width), device=device, dtype=dtype)
        mask = torch.ones(int(b_hat), int(seq_len), dtype=torch.long, device=device)
        _one_call(work, x, mask, device, precision)  # warm-up
        means = []
        for _ in range(max(1, repeats)):
            total, calls = 0.0, 0
            while calls == 0 or total < WINDOW_S:
                elapsed = _one_call(work, x, mask, device, precision)
                if after_each is not None:
                    elapsed += after_each(elapsed)
                total += elapsed
                calls += 1
            means.append(total / calls)
        out.append(statistics.median(means))
    return out


def _one_call(work: nn.Module, x: torch.Tensor, mask: torch.Tensor, device: torch.device, precision: str) -> float:
    leaf = x.detach().requires_grad_(True)
    start = time.perf_counter()
    with autocast(precision, device.type):
        hidden = work(leaf, mask)
    hidden.float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    work.zero_grad(set_to_none=True)
    return elapsed


def host_flop_rate(
    block: nn.Module, hidden: torch.Tensor, mask: torch.Tensor, flops: float, precision: str = "fp32", min_cpu_s=0.3
) -> float:
    """FLOP/s of one host thread on one TEB's forward + backward: ``flops`` (the workload's count for one call on
    ``hidden``, o_l + o'_l times its samples) over the CPU seconds of this thread per call (``time.thread_time``,
    at least ``min_cpu_s`` of them, after one untimed call), with torch on one thread as the devices run. The
    virtual clock's host speed: a device of phi_k f_k FLOP/s takes host speed / phi_k f_k times the CPU seconds a
    call took here (``pipeline/virtual_clock.py``)."""
    if not flops > 0:
        raise ValueError(f"the calibration call needs a positive FLOP count, got {flops}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        work = copy.deepcopy(block).train()
        device = torch.device("cpu")
        _one_call(work, hidden, mask, device, precision)  # warm-up
        start, calls = time.thread_time(), 0
        while calls < 3 or time.thread_time() - start < min_cpu_s:
            _one_call(work, hidden, mask, device, precision)
            calls += 1
        return flops * calls / max(time.thread_time() - start, 1e-9)
    finally:
        torch.set_num_threads(threads)


def memory_limit_bytes() -> float:
    """The memory this process may use: the host's available memory, or its memory cgroup's limit if lower (its
    own cgroup's or an ancestor's, ``testbed.memory_limit.own_memory_limit``: a testbed device's gamma_k^max;
    or the files a container shows at the top of its hierarchy)."""
    available = float(psutil.virtual_memory().available)
    own = own_memory_limit()
    if own is not None:
        available = min(available, own)
    for name in _MEMORY_LIMIT_FILES:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, float(text))
    return available


def payload(nbytes: int) -> torch.Tensor:
    """A tensor of ``nbytes`` bytes (what an activation of that size costs to move)."""
    return torch.empty(max(1, int(nbytes)), dtype=torch.uint8)
