"""Run the optimizer alone for T rounds per policy and plot cumulative modelled delay (paper Fig. 11).

    python -m collapipe_flwr.apps.simulate --rounds T --out DIR [--network paper_table2] [--clusters 3]
        [--scheduler dssra] [--V V] [hydra overrides, e.g. network.num_channels=4]

The network, scheduler and seed come from the same config path as ``flwr run`` (``config.load_run_config``;
the flags are shorthands for the overrides ``network=``, ``federation.num_clusters=``, ``scheduler=``,
``scheduler.V=``, ``seed=``).

No training: the workload is counted on a generic encoder (torch TransformerEncoderLayer, sizes from the
flags) and ``loss_only`` gets a proxy loss: cluster n's loss is L_n(u) = 1 + c_n exp(-u / 10) + noise,
u = how many rounds n has trained so far, c_n in [1, 3] (a harder dataset decays from higher), so a
cluster that trains less keeps a higher loss. Writes DIR/cumulative_delay.csv, DIR/summary.json,
DIR/cumulative_delay.png and DIR/convergence_term.png (running mean of Gamma, eq. 28); prints
`cumulative_delay_s_<policy>`, `mean_gamma_<policy>` and `worst_cluster_gamma_<policy>` lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import matplotlib
import numpy as np
import torch
from torch import nn

from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra.policies import convergence_params, make_policy
from collapipe_flwr.dssra.specs import SchedulerSpec
from collapipe_flwr.errors import ConfigError, exit_on_user_error
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import StateSampler
from collapipe_flwr.system.workload import RoundShape, Workload, measure_workload

POLICY_ORDER = ("dssra", "uniform", "random", "loss_only", "delay_only")


def generic_workload(
    d_model: int, heads: int, d_ff: int, layers: int, seq_len: int, batch_size: int, steps: int
) -> Workload:
    """Workload counted on ``layers`` torch TransformerEncoderLayers (probe batch of 2, b = batch_size)."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=0.0, batch_first=True)

        def forward(self, hidden, attention_mask):
            return self.layer(hidden, src_key_padding_mask=attention_mask == 0)

    torch.manual_seed(0)
    blocks = nn.ModuleList([Block() for _ in range(layers)])
    hidden = torch.randn(2, seq_len, d_model)
    round_shape = RoundShape(batch_size=batch_size, steps_per_round=steps)
    return measure_workload(blocks, hidden, torch.ones(2, seq_len, dtype=torch.long), round_shape=round_shape)


def run(
    policy_name: str, rounds: int, spec: NetworkSpec, workload: Workload, scheduler: SchedulerSpec, seed: int
) -> dict:
    """One policy over ``rounds`` rounds (same states for every policy): the cumulative modelled delay, Gamma, and
    per round the number of selected CUs and the slowest selected CU's tau_n^pipe and uplink time (the two parts
    of the round delay tau(t), eq. 26)."""
    sched = dataclasses.replace(scheduler, name=policy_name)
    if policy_name == "uniform":
        sched = dataclasses.replace(sched, segment_scheduling=False)
    policy = make_policy(sched, spec, workload, seed)
    sampler = StateSampler(spec, seed)
    rng = np.random.default_rng([seed, 77])
    difficulty = rng.uniform(1.0, 3.0, spec.num_clusters)
    trained = np.zeros(spec.num_clusters)
    delays, gammas, per_cluster = [], [], []
    selected, bottleneck_pipeline, bottleneck_uplink = [], [], []
    for t in range(rounds):
        plan = policy.plan(t, sampler.sample(t))
        selected.append(len(plan.selected))
        modelled = plan.modelled
        assert modelled is not None, "a policy's plan carries its modelled figures"
        rows = [r for r in modelled.clusters if r.delay_s > 0]
        worst = max(rows, key=lambda r: r.delay_s) if rows else None
        bottleneck_pipeline.append(worst.pipeline_s if worst is not None else 0.0)
        bottleneck_uplink.append(worst.uplink_s if worst is not None else 0.0)
        for c in plan.selected:
            trained[c.cluster] += 1
        losses = {
            c.cluster: float(1.0 + difficulty[c.cluster] * np.exp(-trained[c.cluster] / 10) + rng.normal(0, 0.02))
            for c in plan.selected
        }
        policy.observe(plan, losses)
        delays.append(modelled.round_delay_s)
        gammas.append(modelled.gamma_mean)
        per_cluster.append([row.gamma for row in modelled.clusters])
    return {
        "cumulative_s": np.cumsum(delays).tolist(),
        "gamma_running_mean": (np.cumsum(gammas) / np.arange(1, rounds + 1)).tolist(),
        "gamma_mean": float(np.mean(gammas)),
        # C10 is per cluster: the worst cluster's time-average Gamma_n
        "gamma_worst_cluster": float(np.max(np.mean(per_cluster, axis=0))),
        "delay_mean_s": float(np.mean(delays)),
        "selected": selected,
        "bottleneck_pipeline_s": bottleneck_pipeline,
        "bottleneck_uplink_s": bottleneck_uplink,
    }


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m collapipe_flwr.apps.simulate``."""
    ap = argparse.ArgumentParser(prog="python -m collapipe_flwr.apps.simulate", description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml (network.*, scheduler.*)")
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--network", default="paper_table2")
    ap.add_argument("--scheduler", default="dssra", help="conf/scheduler preset giving V and the convergence constants")
    ap.add_argument("--clusters", type=int, default=3, help="N (paper default 3)")
    ap.add_argument("--V", type=float, default=None)
    ap.add_argument("--policies", default=",".join(POLICY_ORDER))
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1, help="local steps per round")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _policies(args: argparse.Namespace) -> list[str]:
    """The --policies to compare, after checking --rounds >= 1 and that every policy is known."""
    if args.rounds < 1:
        raise ConfigError(f"--rounds={args.rounds} must be >= 1")
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICY_ORDER]
    if unknown:
        raise ConfigError(f"--policies names unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_ORDER)}")
    return policies


def _write_records(args: argparse.Namespace, policies: list[str], results: dict, V: float, workload: Workload) -> None:
    """cumulative_delay.csv (one row per round t, one column per policy) and summary.json under --out."""
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "cumulative_delay.csv", "w") as fh:
        fh.write("round," + ",".join(policies) + "\n")
        for t in range(args.rounds):
            fh.write(f"{t + 1}," + ",".join(f"{results[p]['cumulative_s'][t]:.6f}" for p in policies) + "\n")
    summary = {
        "rounds": args.rounds,
        "network": args.network,
        "clusters": args.clusters,
        "V": V,
        "workload": workload.to_dict(),
        "policies": {
            p: {k: v for k, v in r.items() if k not in ("cumulative_s", "gamma_running_mean")}
            | {"cumulative_s": r["cumulative_s"][-1]}
            for p, r in results.items()
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))


def _plot(args: argparse.Namespace, policies: list[str], results: dict, V: float, gamma_max: float) -> None:
    """cumulative_delay.png and convergence_term.png (running mean of Gamma, eq. 28, against Gamma^max)."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the headless backend

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        ax.plot(range(1, args.rounds + 1), results[p]["cumulative_s"], label=p)
    ax.set_xlabel("communication round t")
    ax.set_ylabel("cumulative modelled delay (s)")
    ax.set_title(f"{args.network}, N={args.clusters}, V={V}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "cumulative_delay.png", dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        ax.plot(range(1, args.rounds + 1), results[p]["gamma_running_mean"], label=p)
    ax.axhline(gamma_max, ls="--", c="grey", label="Gamma^max")
    ax.set_xlabel("communication round t")
    ax.set_ylabel("running mean of Gamma over clusters (eq. 28)")
    ax.set_title(f"{args.network}, N={args.clusters}, V={V}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "convergence_term.png", dpi=120)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_intermixed_args(argv)
    policies = _policies(args)
    shorthand = [
        f"network={args.network}",
        f"federation.num_clusters={args.clusters}",
        f"scheduler={args.scheduler}",
        f"seed={args.seed}",
    ]
    if args.V is not None:
        shorthand.append(f"scheduler.V={args.V}")
    cfg = load_run_config([*shorthand, *args.overrides])
    spec, scheduler = cfg.network, cfg.scheduler
    workload = generic_workload(
        args.d_model, args.heads, args.d_ff, args.layers, args.seq_len, args.batch_size, args.steps
    )
    spec = spec.sized_to(workload.encoder_memory_bytes)  # device.memory_share: gamma_k^max of this workload
    results = {p: run(p, args.rounds, spec, workload, scheduler, cfg.seed) for p in policies}
    _write_records(args, policies, results, scheduler.V, workload)
    _plot(args, policies, results, scheduler.V, convergence_params(scheduler, spec, workload.num_blocks).gamma_max)
    for p in policies:
        print(f"cumulative_delay_s_{p}: {results[p]['cumulative_s'][-1]:.3f}")
        print(f"mean_gamma_{p}: {results[p]['gamma_mean']:.5g}")
        print(f"worst_cluster_gamma_{p}: {results[p]['gamma_worst_cluster']:.5g}")


if __name__ == "__main__":
    main()
