"""Fig. 5 in the model: each cluster's optimal (S, m) and the pipeline delay over m, optimizer only.

    python results/fig5_segments.py [--out results/fig5] [hydra overrides ...]

The paper's setting (network=paper_table2: N = 3 clusters of K = 6 heterogeneous devices; the paper's
Transformer encoder, L = 6 blocks of d_model 512, counted on generic blocks; b = 64, one batch a round)
in round 0 of the system model's random state (f_k(t), D2D gains). For every cluster and every m in 1..b,
Sub-1 (exact, Y = 0) gives the best partition and its pipeline delay tau^pipe (eq. 15 with the
per-micro-batch cost c0, network.device.per_microbatch_s); the uniform partition over all K devices
(CollaPipe w/o SS, Fig. 5's "uniform TEB allocation") is shown beside it. Writes OUT/fig5_delay_vs_m.png
and prints per cluster ``S_n``, ``m_n``, ``delta_n`` (as text), ``pipeline_s_n`` and ``uniform_best_s_n``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lyapunov import table2_setting  # noqa: E402
from reportlib import plots  # noqa: E402

from collapipe_flwr.dssra.cluster_model import ClusterModel  # noqa: E402
from collapipe_flwr.dssra.segments import fixed_segments, solve_segments, uniform_delta  # noqa: E402
from collapipe_flwr.errors import InfeasiblePlanError  # noqa: E402
from collapipe_flwr.system.state import StateSampler  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args, cfg, workload = table2_setting(__doc__ or "", "fig5", argv)
    state = StateSampler(cfg.network, cfg.seed).sample(0)
    b = workload.batch_size
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    print(f"per_microbatch_s: {cfg.network.per_microbatch_s:g}")
    for n in range(cfg.network.num_clusters):
        model = ClusterModel.build(cfg.network, state, workload, n)
        drift = np.zeros(model.K + 1)
        best = solve_segments(model, 1.0, drift, range(1, b + 1))
        curve, uniform = [], []
        for m in range(1, b + 1):
            try:
                curve.append(solve_segments(model, 1.0, drift, [m]).pipeline_s)
            except InfeasiblePlanError:
                curve.append(np.nan)
            try:
                uniform.append(
                    fixed_segments(model, 1.0, drift, uniform_delta(model.K, model.num_blocks), m).pipeline_s
                )
            except InfeasiblePlanError:
                uniform.append(np.nan)
        line = ax.plot(range(1, b + 1), curve, label=f"cluster {n}: Sub-1, best (S, m) = ({best.S}, {best.m})")
        ax.plot(range(1, b + 1), uniform, ls=":", c=line[0].get_color(), label=f"cluster {n}: uniform over K")
        ax.scatter([best.m], [best.pipeline_s], color=line[0].get_color())
        print(f"S_{n}: {best.S}")
        print(f"m_{n}: {best.m}")
        print(f"delta_{n}: {' '.join(str(d) for d in best.delta)}")
        print(f"pipeline_s_{n}: {best.pipeline_s:.4f}")
        print(f"uniform_best_s_{n}: {np.nanmin(uniform):.4f}")
    ax.set_yscale("log")
    plots.label(ax, "micro-batches m", "pipeline delay tau^pipe (s, eq. 15 + c0)", fontsize=7)
    args.out.mkdir(parents=True, exist_ok=True)
    plots.save(fig, args.out / "fig5_delay_vs_m.png")


if __name__ == "__main__":
    main()
