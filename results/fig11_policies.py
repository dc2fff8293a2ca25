"""Fig. 11 in the model: total delay of DSSRA against the loss-only, delay-only and random schedulers, with CU
selection at work (N = 10 CUs > J = 4 channels), over several seeds.

    python results/fig11_policies.py --out results/fig11 [--rounds 150] [--seeds 0 1 2] [hydra overrides]

The paper (Fig. 11, BERT on Toutiao, V = 0.01): DSSRA lowers the total latency by 46.44% against loss-only,
15.48% against delay-only and 7.12% against random scheduling. This drives each policy alone
(``collapipe_flwr.apps.simulate.run``: no training, proxy losses for loss-only) on ``network=selection`` with
N = 10, one batch per round (Algorithm 1), the classification task's BERT-small workload, and Gamma^max for
N = 10, J = 4 (0.95, docs/system_model.md). Writes ``OUT/table.md`` (reductions, mean and spread over seeds,
beside the paper's), ``OUT/policies.csv``, ``OUT/cumulative_delay.png``; prints ``name: value`` lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fig7_8_methods import task_workload  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib import plots  # noqa: E402
from reportlib.stats import mean_sd  # noqa: E402

from collapipe_flwr.apps.simulate import run  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402

PAPER = {"loss_only": 46.44, "delay_only": 15.48, "random": 7.12}
SETTING = ["network=selection", "federation.num_clusters=10", "scheduler.convergence.gamma_max=0.95"]


def run_policies(cfg, workload, rounds: int, seeds: list[int]) -> dict:
    """Every policy (DSSRA and the paper's three) for ``rounds`` rounds at each seed: ``{(policy, seed): run}``."""
    return {(p, s): run(p, rounds, cfg.network, workload, cfg.scheduler, s) for p in ("dssra", *PAPER) for s in seeds}


def reductions(results: dict, policy: str, seeds: list[int]) -> list[float]:
    """Per seed, DSSRA's total delay reduction against ``policy`` (%): 1 - sum_t tau_DSSRA / sum_t tau_policy."""
    return [
        100.0 * (1 - results[("dssra", s)]["cumulative_s"][-1] / results[(policy, s)]["cumulative_s"][-1])
        for s in seeds
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_intermixed_args(argv)
    workload = task_workload("classification", [*SETTING, *args.overrides])
    cfg = load_run_config([*SETTING, *args.overrides])
    policies = ("dssra", *PAPER)
    results = run_policies(cfg, workload, args.rounds, args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "policies.csv", "w") as fh:
        fh.write("policy,seed,cumulative_delay_s,gamma_mean,gamma_worst_cluster\n")
        for (p, s), r in results.items():
            fh.write(f"{p},{s},{r['cumulative_s'][-1]:.6f},{r['gamma_mean']:.6g},{r['gamma_worst_cluster']:.6g}\n")
    seeds = ", ".join(map(str, args.seeds))
    lines = [
        f"# Fig. 11 in the model: N = 10 CUs, J = 4 channels, {args.rounds} rounds, seeds {seeds}",
        "",
        *md.head(
            "| DSSRA vs | total delay reduction, mean +- sd over seeds | paper "
            "| worst cluster's mean Gamma_n (DSSRA / it) |"
        ),
    ]
    for p, paper in PAPER.items():
        per_seed = reductions(results, p, args.seeds)
        mean, sd = mean_sd(per_seed)
        g_ours = statistics.fmean(results[("dssra", s)]["gamma_worst_cluster"] for s in args.seeds)
        g_theirs = statistics.fmean(results[(p, s)]["gamma_worst_cluster"] for s in args.seeds)
        lines.append(f"| {p} | {mean:.2f}% +- {sd:.2f} | {paper}% | {g_ours:.3f} / {g_theirs:.3f} |")
        print(f"reduction_pct_vs_{p}: {mean:.4g}")
    lines.append(
        f"\nGamma^max = {'auto' if cfg.scheduler.gamma_max_auto else cfg.scheduler.gamma_max} (C10: a cluster's "
        "long-run mean Gamma_n must stay below it)."
    )
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    curves = {p: [results[(p, s)]["cumulative_s"] for s in args.seeds] for p in policies}
    title = f"N = 10 > J = 4, mean of {len(args.seeds)} seeds"
    plots.mean_curves(curves, "total modelled delay so far (s)", title, args.out / "cumulative_delay.png")


if __name__ == "__main__":
    main()
