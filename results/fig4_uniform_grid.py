"""Fig. 4 in the model: training time of one round with an even distribution of delta, over S and m.

    python results/fig4_uniform_grid.py [--out results/fig4] [hydra overrides ...]

The paper (Fig. 4, the Transformer): with the encoder split evenly over S devices (delta_k = L / S), "there is
always an optimal S and m value". Here: the paper's Transformer encoder (``model=transformer_paper``, L = 6
blocks of d_model 512, counted on generic blocks, b = 64, one batch a round), cluster 0 of the Table II
network in round 0, the S fastest devices each holding L / S blocks for every S that divides L, and every m in
1..b; the delay is eq. (15) with the per-micro-batch cost c0 (``network.device.per_microbatch_s``) and the D2D
hand-over. Writes ``OUT/fig4_delay_grid.png`` and ``OUT/grid.csv``; prints ``delay_s_S{S}_m{m}`` for
m in 1, 2, 4, ..., b, ``best_S``, ``best_m`` and ``best_delay_s``.
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
from collapipe_flwr.system.state import StateSampler  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args, cfg, workload = table2_setting(__doc__ or "", "fig4", argv)
    model = ClusterModel.build(cfg.network, StateSampler(cfg.network, cfg.seed).sample(0), workload, 0)
    L, b = model.num_blocks, workload.batch_size
    fastest = np.argsort(-model.flops_per_second, kind="stable")
    grid: dict[int, list[float]] = {}
    for S in [s for s in range(1, min(L, model.K) + 1) if L % s == 0]:
        delta = np.zeros(model.K, dtype=int)
        delta[fastest[:S]] = L // S
        grid[S] = [model.evaluate(delta, m)["pipeline_s"] for m in range(1, b + 1)]
    best_S, best_m = min(((S, m) for S in grid for m in range(1, b + 1)), key=lambda sm: grid[sm[0]][sm[1] - 1])
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "grid.csv", "w") as fh:
        fh.write("m," + ",".join(f"S{S}" for S in grid) + "\n")
        for m in range(1, b + 1):
            fh.write(f"{m}," + ",".join(f"{grid[S][m - 1]:.6f}" for S in grid) + "\n")
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for S, delays in grid.items():
        ax.plot(range(1, b + 1), delays, label=f"S = {S} (delta_k = {L // S})")
    ax.scatter([best_m], [grid[best_S][best_m - 1]], color="black", zorder=3, label=f"best: S = {best_S}, m = {best_m}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    title = f"even delta, cluster 0 of Table II, c0 = {cfg.network.per_microbatch_s:g} s"
    plots.label(ax, "micro-batches m", "round delay tau^pipe (s, eq. 15 + c0)", title, fontsize=8)
    plots.save(fig, args.out / "fig4_delay_grid.png")
    m = 1
    while m <= b:
        for S in grid:
            print(f"delay_s_S{S}_m{m}: {grid[S][m - 1]:.4f}")
        m *= 2
    print(f"best_S: {best_S}")
    print(f"best_m: {best_m}")
    print(f"best_delay_s: {grid[best_S][best_m - 1]:.4f}")


if __name__ == "__main__":
    main()
