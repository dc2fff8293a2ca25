"""What this machine gives two devices computing at once: two pinned processes, alone and together."""

from __future__ import annotations

import contextlib
import os
import statistics
import time

import torch

from collapipe_flwr.pipeline.executors import usable_cores_list
from overhead.bounds import gpipe_limit_S2
from overhead.model import HIDDEN, make_model


def _pair_worker(conn, core: int, rows: int, seq_len: int, blocks: int, m: int) -> None:
    """One device's work of a GPipe step in a process of its own on ``core``: ``blocks`` TEBs of the benchmark's
    model, m forwards on ``rows`` x ``seq_len`` micro-batches, then their m backwards in reverse order (the stage's
    order, so all m micro-batches' activations are held at once), one torch thread; answers each count n it receives
    with the seconds n such steps took, until it receives None."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    segment = make_model().blocks[:blocks]
    inputs = [torch.randn(rows, seq_len, HIDDEN) for _ in range(m)]
    mask = torch.ones(rows, seq_len, dtype=torch.long)

    def step() -> None:
        outputs = []
        for x in inputs:
            hidden = x.detach().requires_grad_(True)
            for block in segment:
                hidden = block(hidden, mask)
            outputs.append(hidden)
        for hidden in reversed(outputs):
            hidden.sum().backward()
        for p in segment.parameters():
            p.grad = None

    while (n := conn.recv()) is not None:
        start = time.perf_counter()
        for _ in range(n):
            step()
        conn.send(time.perf_counter() - start)


def pair_figures(rows: int, seq_len: int, blocks: int, m: int = 4, rounds: int = 5, steps: int = 2) -> dict[str, float]:
    """What this machine gives two devices that compute at once (the S = 2 figures' premise: one core each, as
    fast as one alone). Two processes, each pinned to its own core with one torch thread, run one device's work of
    a GPipe step of S = 2 (``_pair_worker``: its ``blocks`` blocks, m micro-batches of ``rows`` x ``seq_len``)
    ``steps`` times, first each alone, then both at once, ``rounds`` times in alternation;
    ``machine_pair_slowdown`` = median seconds at once / median seconds alone (1 on two independent cores; a VM
    whose two vCPUs share a physical core, a host that is busy, or two devices contending for memory bandwidth
    read more), and ``gpipe_limit_S2_m{m}_at_pair_slowdown`` is GPipe's S = 2 limit with that slowdown
    (:func:`gpipe_limit_S2`; modelled from the measured c). Empty on a host with fewer than two usable cores."""
    import multiprocessing

    cores = usable_cores_list()[:2]
    if len(cores) < 2:
        return {}
    ctx = multiprocessing.get_context("spawn")
    conns, procs = [], []
    alone: list[float] = []
    together: list[float] = []

    def answer(conn) -> float:
        if not conn.poll(600):
            raise RuntimeError("a pair-figure worker gave no answer in 600 s")
        return conn.recv()

    try:
        for core in cores:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pair_worker, args=(child, core, rows, seq_len, blocks, m), daemon=True)
            proc.start()
            conns.append(parent)
            procs.append(proc)
        for conn in conns:  # warm-up, one at a time
            conn.send(1)
            answer(conn)
        for _ in range(rounds):
            for conn in conns:
                conn.send(steps)
                alone.append(answer(conn))
            for conn in conns:
                conn.send(steps)
            together.extend(answer(conn) for conn in conns)
    finally:
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    slowdown = statistics.median(together) / statistics.median(alone)
    return {
        "machine_alone_s": statistics.median(alone) / steps,
        "machine_pair_s": statistics.median(together) / steps,
        "machine_pair_slowdown": slowdown,
        f"gpipe_limit_S2_m{m}_at_pair_slowdown": gpipe_limit_S2(m, slowdown),
    }
