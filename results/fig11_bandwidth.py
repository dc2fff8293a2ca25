"""Fig. 11's margins against the uplink's share of the round: the same runs as ``fig11_policies.py`` with the
uplink bandwidth B_n^U scaled, optimizer only.

    python results/fig11_bandwidth.py --out results/fig11/bandwidth [--scales 1 10 100 1000] [--seeds 0 1 2]

On ``network=selection`` (Table II's B_n^U = 0.4-0.6 MHz) the uplink is 91-98.5% of every policy's round delay
(``fig11/uplink_share.txt``), so DSSRA's channel matching decides the margins. This multiplies both ends of
``network.channel_bandwidth_hz`` by each scale (everything else as in ``fig11_policies.py``: N = 10, J = 4,
BERT-small classification workload, Gamma^max = 0.95, V = 0.01), and per scale reports DSSRA's total delay
reduction against loss-only / delay-only / random (mean +- sd over seeds, eq. 26 summed over the rounds) beside
the uplink share of DSSRA's round (the slowest selected CU's uplink time over its tau^pipe + uplink).
Writes ``OUT/table.md`` and ``OUT/margins_vs_bandwidth.png``; prints ``name: value`` lines.
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
from fig11_policies import PAPER, SETTING, reductions, run_policies  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib import plots  # noqa: E402
from reportlib.stats import mean_sd  # noqa: E402

from collapipe_flwr.config import compose, load_run_config  # noqa: E402

TABLE_HEAD = (
    *md.head(
        "| B_n^U scale | B_n^U (MHz) | DSSRA's uplink share | vs loss-only | vs delay-only | vs random "
        "| DSSRA's worst mean Gamma_n |"
    ),
)


def uplink_share(results: dict, policy: str, seeds: list[int]) -> float:
    """The bottleneck CU's uplink time over its tau^pipe + uplink, summed over every round and seed."""
    up = sum(x for s in seeds for x in results[(policy, s)]["bottleneck_uplink_s"])
    pipe = sum(x for s in seeds for x in results[(policy, s)]["bottleneck_pipeline_s"])
    return up / (up + pipe)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--scales", type=float, nargs="+", default=[1, 3, 10, 30, 100, 300, 1000])
    args = ap.parse_args(argv)
    base = compose(SETTING)["network"]["channel_bandwidth_hz"]  # the range [lo, hi] each channel's B_j is drawn from
    seeds = ", ".join(map(str, args.seeds))
    lines = [
        f"# Fig. 11's margins against the uplink bandwidth: N = 10, J = 4, {args.rounds} rounds, seeds {seeds}",
        "",
        *TABLE_HEAD,
    ]
    rows = []
    for scale in args.scales:
        bw = [b * scale for b in base]
        overrides = [*SETTING, f"network.channel_bandwidth_hz=[{bw[0]:.6g},{bw[-1]:.6g}]"]
        cfg = load_run_config(overrides)
        results = run_policies(cfg, task_workload("classification", overrides), args.rounds, args.seeds)
        share = uplink_share(results, "dssra", args.seeds)
        cells, row = [], {"scale": scale, "share": share}
        for p in PAPER:
            per_seed = reductions(results, p, args.seeds)
            mean, sd = mean_sd(per_seed)
            row[p] = mean
            cells.append(f"{mean:.2f}% +- {sd:.2f}")
            print(f"reduction_pct_vs_{p}_bw_x{scale:g}: {mean:.4g}")
        gamma = statistics.fmean(results[("dssra", s)]["gamma_worst_cluster"] for s in args.seeds)
        print(f"uplink_share_dssra_bw_x{scale:g}: {share:.3f}")
        rows.append(row)
        mhz = f"{bw[0] / 1e6:.4g}-{bw[-1] / 1e6:.4g}"
        lines.append(md.row((f"x{scale:g}", mhz, f"{share:.3f}", *cells, f"{gamma:.3f}")))
    lines.append(md.row(("paper", "-", "-", *(f"{v}%" for v in PAPER.values()), "-")))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (p, paper), colour in zip(PAPER.items(), ("C0", "C1", "C2"), strict=True):
        ax.plot([r["share"] for r in rows], [r[p] for r in rows], "o-", color=colour, label=f"vs {p}")
        ax.axhline(paper, color=colour, linestyle=":", linewidth=1)
    title = "Fig. 11 margins as B_n^U grows (dotted: the paper's)"
    plots.label(ax, "uplink share of DSSRA's round delay", "DSSRA's total delay reduction (%)", title)
    plots.save(fig, args.out / "margins_vs_bandwidth.png")


if __name__ == "__main__":
    main()
