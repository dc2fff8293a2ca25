"""Per-micro-batch cost c0 of the real pipeline on this machine (network.device.per_microbatch_s).

With one stage (S = 1) a GPipe step over m micro-batches does the same arithmetic for every m (the batch
is only split), plus m times a fixed cost per micro-batch (an actor call, the hand-off back to the CU,
smaller GEMMs, an extra forward/backward launch). So the step time is a line in m,

    step_s(S=1, m) = W + c0 * m,

with W the whole batch's work and c0 the per-micro-batch cost of eq. (15)'s chunk (docs/system_model.md,
"Per-micro-batch cost"). This script times ``ClusterPipeline`` over Ray (the model and batch of
``pipeline_overhead.py``: BERT-small, 32 x 64 tokens) for a few m at S = 1 and fits the line by least
squares. It prints ``step_s_S1_m{m}``, ``intercept_W_s``, ``per_microbatch_s`` (the slope c0) and
``fit_r2``.

Run: ``python benchmarks/microbatch_cost.py --micro-batches 1 2 4 8 16`` (about 1-2 minutes on 2 cores).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import command_line  # noqa: E402  (benchmarks/, beside this script)
from pipeline_overhead import PlainTrainer, make_batch, pipeline_figures  # noqa: E402

from collapipe_flwr.pipeline.executors import default_actor_threads  # noqa: E402


def fit_line(ms, seconds) -> tuple[float, float, float]:
    """Least squares seconds = W + c0 * m: (W, c0, R^2)."""
    x = np.asarray(ms, dtype=float)
    y = np.asarray(seconds, dtype=float)
    c0, W = np.polyfit(x, y, 1)
    resid = y - (W + c0 * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    return float(W), float(c0), r2


def main() -> None:
    args = command_line.parse(__doc__ or "", batch=32, seq_len=64, warmup=1, steps=3, micro_batches=[1, 2, 4, 8, 16])

    import ray

    ray.init(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    print(f"load_avg_1min: {os.getloadavg()[0]:.2f}")
    batch = make_batch(args.batch, args.seq_len)
    plain = PlainTrainer(1)
    threads = default_actor_threads(1)
    medians, _ = pipeline_figures(batch, 1, args.micro_batches, args.warmup, args.steps, threads, plain)
    ms = sorted(medians)
    for m in ms:
        print(f"step_s_S1_m{m}: {medians[m][0]:.4f}")
    W, c0, r2 = fit_line(ms, [medians[m][0] for m in ms])
    print(f"intercept_W_s: {W:.4f}")
    print(f"per_microbatch_s: {c0:.4f}")
    print(f"fit_r2: {r2:.3f}")
    print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
