"""Figs. 7-8's margins against the device spread inside a cluster: the same runs as ``fig7_8_methods.py`` with
the ranges Table II draws f_k and phi_k from narrowed step by step, optimizer only.

    python results/fig7_8_device_spread.py --task translation --model transformer_paper \
        --out results/fig7_8/device_spread_translation [--steps 0 0.05 0.1 0.2 0.3 0.5 1] [--seeds 0 1 2]

Table II draws f_k from 0.1-0.8 GHz and phi_k from 10-24 FLOPs/cycle, so a cluster's slowest device is several
times slower than its mean. Step a narrows both ranges towards their tops: f_k from (0.1 + 0.5 a)-0.8 GHz and
phi_k from (10 + 10 a)-24 (a = 0: Table II; a = 1: 0.6-0.8 GHz and 20-24, the narrow setting of
``fig7_8/translation_paper_size_narrow_devices``). The devices are the same draws mapped into the narrower
ranges (``network.seed``). Per step: CollaPipe's reduction of the accumulated on-device compute (``compute_s``)
against each baseline (mean +- sd over seeds), CollaPipe's mean S, and how much slower than its cluster's mean
the slowest device is (phi_k f_k, the worst cluster). Writes ``OUT/table.md`` and ``OUT/margins_vs_spread.png``;
prints ``name: value`` lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fig7_8_methods import (  # noqa: E402
    COMMON,
    METHODS,
    MODELS,
    PAPER,
    PAPER_NO_SS_INCREASE,
    reduction,
    run_method,
    task_workload,
)
from reportlib import markdown as md  # noqa: E402
from reportlib import plots  # noqa: E402
from reportlib.stats import mean_sd  # noqa: E402

from collapipe_flwr.config import load_run_config  # noqa: E402

SPREAD_COLUMNS = ("a", "f_k (GHz)", "phi_k", "slowest device vs its cluster's mean")
PAPER_MARGINS = {**PAPER, "collapipe_no_ss": reduction(1, 1 + PAPER_NO_SS_INCREASE / 100)}


def spread_overrides(a: float) -> list[str]:
    """Step a of the narrowing: f_k in [(0.1 + 0.5 a) GHz, 0.8 GHz], phi_k in [10 + 10 a, 24]."""
    return [
        f"network.device.f_hz=[{1e8 + 5e8 * a:.6g},8e+08]",
        f"network.device.flops_per_cycle=[{10 + 10 * a:.6g},24]",
    ]


def slowest_vs_mean(overrides: list[str]) -> float:
    """The largest (cluster mean of phi_k f_k) / (its slowest device's phi_k f_k) over the clusters."""
    network = load_run_config([*COMMON, *overrides]).network
    ratios = []
    for n in range(network.num_clusters):
        speeds = np.array([d.flops_per_second for d in network.devices_of(n)])
        ratios.append(speeds.mean() / speeds.min())
    return float(max(ratios))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (e.g. network.device.memory_bytes=6e9)")
    ap.add_argument("--task", choices=sorted(MODELS), required=True)
    ap.add_argument("--model", default="", help="model preset (conf/model/); default: the task's small model")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=float, nargs="+", default=[0, 0.05, 0.1, 0.2, 0.3, 0.5, 1])
    args = ap.parse_intermixed_args(argv)
    model_name = args.model or MODELS[args.task]
    workload = task_workload(args.task, args.overrides, model_name)  # the model's work: the same for every spread
    bases = METHODS[1:]
    lines = [
        f"# Figs. 7-8's margins against the device spread: {args.task} ({model_name}), {args.rounds} rounds, "
        f"seeds {', '.join(map(str, args.seeds))}; CollaPipe's reduction of the accumulated on-device compute",
        "",
        *md.head(md.row((*SPREAD_COLUMNS, *(f"vs {b}" for b in bases), "CollaPipe's mean S"))),
    ]
    rows = []
    for a in args.steps:
        row, line = _spread_step(args, model_name, workload, a)
        rows.append(row)
        lines.append(line)
    lines.append("| paper | | | | " + " | ".join(f"{PAPER_MARGINS[b]:.2f}%" for b in bases) + " | |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    _plot_margins(rows, args)


def _spread_step(args: argparse.Namespace, model_name: str, workload, a: float) -> tuple[dict, str]:
    """Every method at step ``a`` of the narrowing: the row the plot reads (each baseline's mean margin) and the
    table's line; prints the step's figures."""
    overrides = [*args.overrides, *spread_overrides(a)]
    runs = {
        (method, s): run_method(method, args.task, model_name, workload, args.rounds, s, overrides)
        for method in METHODS
        for s in args.seeds
    }
    total = {key: sum(run["compute_s"]) for key, run in runs.items()}
    row = {"a": a, "ratio": slowest_vs_mean(overrides)}
    cells = []
    for base in METHODS[1:]:
        mean, sd = mean_sd([reduction(total[("collapipe", s)], total[(base, s)]) for s in args.seeds])
        row[base] = mean
        cells.append(f"{mean:.2f}% +- {sd:.2f}")
        print(f"reduction_pct_compute_s_vs_{base}_a{a:g}: {mean:.4g}")
    mean_S = float(np.mean([np.mean(runs[("collapipe", s)]["S"]) for s in args.seeds]))
    print(f"slowest_vs_mean_a{a:g}: {row['ratio']:.3g}")
    f_lo, phi_lo = 0.1 + 0.5 * a, 10 + 10 * a
    return row, md.row(
        (f"{a:g}", f"{f_lo:.3g}-0.8", f"{phi_lo:.3g}-24", f"{row['ratio']:.2f}x", *cells, f"{mean_S:.2f}")
    )


def _plot_margins(rows: list[dict], args: argparse.Namespace) -> None:
    """``margins_vs_spread.png``: each baseline's margin against the slowest device's deficit, the paper's dotted."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, base in enumerate(METHODS[1:]):
        ax.plot([r["ratio"] for r in rows], [r[base] for r in rows], "o-", color=f"C{i}", label=f"vs {base}")
        ax.axhline(PAPER_MARGINS[base], color=f"C{i}", linestyle=":", linewidth=1)
    xlabel = "slowest device's speed deficit (cluster mean / slowest, worst cluster)"
    title = f"{args.task}: margins as the device spread narrows (dotted: the paper's)"
    plots.label(ax, xlabel, "reduction of on-device compute (%)", title, fontsize=8)
    plots.save(fig, args.out / "margins_vs_spread.png")


if __name__ == "__main__":
    main()
