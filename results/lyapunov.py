"""Lyapunov control at work (eqs. 28-29, C10): Y_n over rounds and the V trade-off, optimizer only.

    python results/lyapunov.py [--rounds 200] [--out results/lyapunov] [hydra overrides ...]

Drives the DSSRA policy (``scheduler=dssra`` on network ``small``, the default of the config when the figures
were first made and pinned here since, so they regenerate: N = 2 CUs, the
transformer_small encoder counted on generic blocks, b = 64, one pipelined batch a round as in Algorithm 1:
``federation.local_steps=1`` unless overridden)
over ``--rounds`` rounds of the system model's random channels (``StateSampler``), once per V in
{0.01, 1, 10, 100}, with the same channel draws for every V. No training.

Writes OUT/queues.png (Y_n over rounds, one panel per V), OUT/v_tradeoff.png (mean modelled round delay
vs the worst cluster's time-average Gamma_n, the quantity C10 bounds, one point per V, Gamma^max dashed),
OUT/lyapunov.csv (round, V, n, S_n, m_n, Gamma_n, Y_n, delay) and prints ``name: value`` lines: per V
the mean delay, mean Gamma, the worst cluster's mean Gamma_n, the share of rounds in which some Y_n > 0
(C10 binding) and the largest Y_n.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reportlib import plots  # noqa: E402  (results/, first on sys.path when run as a script)

from collapipe_flwr.apps.simulate import generic_workload  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.dssra.policies import convergence_params, make_policy  # noqa: E402
from collapipe_flwr.system.state import StateSampler  # noqa: E402

V_VALUES = (0.01, 1.0, 10.0, 100.0)


def table2_setting(doc: str, figure: str, argv: list[str] | None) -> tuple[argparse.Namespace, object, object]:
    """(arguments, config, workload) of a figure over one of Table II's clusters with the paper's Transformer
    (network=paper_table2, N = 3, max_len 64, one local step) and the Hydra overrides given: its command line is
    ``[overrides ...] [--out results/<figure>]`` (``doc``: the script's docstring)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / figure)
    args = ap.parse_args(argv)
    base = ["network=paper_table2", "federation.num_clusters=3", "model=transformer_paper", "task.max_len=64"]
    cfg = load_run_config([*base, "federation.local_steps=1", *args.overrides])
    return args, cfg, config_workload(cfg)


def config_workload(cfg):
    """The configured encoder (sizes, L, b, max_len, local steps) counted on generic Transformer blocks."""
    sizes = cfg.model.sizes
    return generic_workload(
        cfg.model.width,
        sizes["n_heads"],
        sizes["d_ff"],
        cfg.model.encoder_blocks,
        cfg.task.max_len,
        cfg.task.batch_size,
        cfg.federation.local_steps,
    )


def drive(cfg, workload, V: float, rounds: int) -> list[dict]:
    """One row per (round, cluster): the plan's S, m, Gamma_n, the queue Y_n it was planned with, the delay."""
    sched = dataclasses.replace(cfg.scheduler, V=V)
    network = cfg.network.sized_to(workload.encoder_memory_bytes)  # a network giving memory as shares of the model
    policy = make_policy(sched, network, workload, cfg.seed)
    sampler = StateSampler(network, cfg.seed)
    rows = []
    for t in range(rounds):
        plan = policy.plan(t, sampler.sample(t))
        for c, mod in zip(plan.clusters, plan.modelled.clusters):
            rows.append(
                {
                    "round": t,
                    "V": V,
                    "n": c.cluster,
                    "S": c.S,
                    "m": c.m,
                    "gamma": mod.gamma,
                    "Y": mod.Y,
                    "delay": plan.modelled.round_delay_s,
                }
            )
        policy.observe(plan, {})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "lyapunov")
    args = ap.parse_args(argv)
    base = ["scheduler=dssra", "network=small", "federation.num_clusters=2", "federation.local_steps=1"]
    cfg = load_run_config([*base, *args.overrides])
    workload = config_workload(cfg)
    runs = {V: drive(cfg, workload, V, args.rounds) for V in V_VALUES}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "lyapunov.csv", "w") as fh:
        fh.write("round,V,n,S,m,gamma,Y,delay_s\n")
        for rows in runs.values():
            for r in rows:
                fh.write(
                    f"{r['round']},{r['V']:g},{r['n']},{r['S']},{r['m']},{r['gamma']:.6g},{r['Y']:.6g},"
                    f"{r['delay']:.6g}\n"
                )
    network = cfg.network.sized_to(workload.encoder_memory_bytes)
    gamma_max = convergence_params(cfg.scheduler, network, workload.num_blocks).gamma_max  # a number, or auto's
    print(f"gamma_max: {gamma_max:g}")
    print(f"rounds: {args.rounds}")
    summary = {V: _summarise(V, rows) for V, rows in runs.items()}
    _plot_queues(runs, cfg.network.num_clusters, args.out / "queues.png")
    _plot_tradeoff(summary, gamma_max, args.out / "v_tradeoff.png")


def _summarise(V: float, rows: list[dict]) -> tuple[float, float]:
    """(mean round delay, the worst cluster's time-average Gamma_n) of one V's rows; prints its figures."""
    per_round: dict[int, list[dict]] = {}
    for r in rows:
        per_round.setdefault(r["round"], []).append(r)
    delay = np.mean([rs[0]["delay"] for rs in per_round.values()])
    gamma = np.mean([r["gamma"] for r in rows])
    binding = np.mean([any(r["Y"] > 0 for r in rs) for rs in per_round.values()])
    # C10 is per cluster: (1/T) sum_t Gamma_n^t <= Gamma^max; the worst cluster's time average
    worst = max(np.mean([r["gamma"] for r in rows if r["n"] == n]) for n in {r["n"] for r in rows})
    print(f"mean_delay_s_V{V:g}: {delay:.3f}")
    print(f"mean_gamma_V{V:g}: {gamma:.5g}")
    print(f"worst_cluster_mean_gamma_V{V:g}: {worst:.5g}")
    print(f"mean_S_V{V:g}: {np.mean([r['S'] for r in rows]):.3f}")
    print(f"share_rounds_Y_positive_V{V:g}: {binding:.3f}")
    print(f"max_Y_V{V:g}: {max(r['Y'] for r in rows):.5g}")
    return delay, worst


def _plot_queues(runs: dict[float, list[dict]], num_clusters: int, path: Path) -> None:
    """Each cluster's virtual queue Y_n over rounds, one panel a V."""
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, len(V_VALUES), figsize=(3.2 * len(V_VALUES), 3), sharey=False)
    for ax, (V, rows) in zip(axes, runs.items()):
        for n in range(num_clusters):
            ys = [r["Y"] for r in rows if r["n"] == n]
            ax.plot(range(len(ys)), ys, label=f"Y_{n}")
        ax.set_title(f"V = {V:g}")
        ax.set_xlabel("round t")
    axes[0].set_ylabel("virtual queue Y_n(t) (eq. 29)")
    axes[0].legend()
    plots.save(fig, path, tight=True)


def _plot_tradeoff(summary: dict[float, tuple[float, float]], gamma_max: float, path: Path) -> None:
    """The V trade-off: mean round delay against the worst cluster's time-average Gamma_n, one point a V."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for V, (delay, gamma) in summary.items():
        ax.scatter(gamma, delay)
        ax.annotate(f"V={V:g}", (gamma, delay), textcoords="offset points", xytext=(5, 5))
    ax.axvline(gamma_max, ls="--", c="grey", label="Gamma^max")
    plots.label(ax, "worst cluster's time-average Gamma_n (C10, eq. 28)", "mean modelled round delay (s, eq. 26)")
    plots.save(fig, path)


if __name__ == "__main__":
    main()
