"""The optimizer-only figures (the planner over the system model -- modelled): Figs. 4 and 5, Fig. 11 with its
uplink share and bandwidth sensitivity, and the Lyapunov settings, from the files their scripts keep."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from reportlib import markdown as md
from reportlib.markdown import name_values, table_rows
from reportlib.records import read_csv
from reportlib.stats import mean_sd

from readme_sections.verdict import MATCH_PP, verdict

RESULTS = Path(__file__).resolve().parent.parent
PAPER_FIG11 = {"loss_only": 46.44, "delay_only": 15.48, "random": 7.12}  # Section VI on Fig. 11, DSSRA's reductions


def fig11_policies() -> list[str]:
    """DSSRA's total-delay reduction against each scheduling baseline (``fig11/policies.csv``: the planner over
    the system model, 150 rounds, seeds 0, 1, 2 -- modelled), per seed then mean +- sd, with the worst cluster's
    mean Gamma_n (C10)."""
    rows = read_csv(RESULTS / "fig11" / "policies.csv")
    by = {(r["policy"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["policy"] == "dssra"}, key=int)
    lines = [
        *md.head(
            "| paper's metric and task: total delay reduction, DSSRA vs | paper | ours, mean +- sd | verdict | worst "
            "cluster's mean Gamma_n (DSSRA / it) |"
        ),
    ]
    for policy, paper in PAPER_FIG11.items():
        red = [
            100.0 * (1.0 - float(by["dssra", s]["cumulative_delay_s"]) / float(by[policy, s]["cumulative_delay_s"]))
            for s in seeds
        ]
        mean, sd = mean_sd(red)
        judged = verdict(mean, paper)
        if sd > MATCH_PP and judged.startswith("miss (") and judged != "miss (sign)":
            judged = judged[:-1] + f", sd {sd:.0f})"
        gamma = [statistics.fmean(float(by[p, s]["gamma_worst_cluster"]) for s in seeds) for p in ("dssra", policy)]
        name = policy.replace("_", "-")
        lines.append(
            f"| {name} | {paper:.2f}% | {mean:.2f}% +- {sd:.2f} | {judged} | {gamma[0]:.3f} / {gamma[1]:.3f} |"
        )
    return lines


def fig4_grid() -> list[str]:
    """Fig. 4's corners and optimum of the round time over S x m with an even delta (``fig4/grid.csv``: the
    system model, modelled)."""
    rows = read_csv(RESULTS / "fig4" / "grid.csv")
    grid = {(int(k[1:]), int(r["m"])): float(v) for r in rows for k, v in r.items() if k.startswith("S")}
    (S, m), best = min(grid.items(), key=lambda kv: kv[1])
    s_values, m_values = sorted({k[0] for k in grid}), sorted({k[1] for k in grid})
    m1 = min(m_values, key=lambda mm: grid[1, mm])
    s_first, s_last, m_last = s_values[0], s_values[-1], m_values[-1]
    corner = grid[s_first, m1]
    return [
        *md.head("| paper's metric and task | paper | ours |"),
        '| round time over S x m, even delta, Transformer: is there an interior optimal (S, m)? | "there is always an '
        f'optimal S and m" | {"yes" if s_first < S < s_last and m_values[0] < m < m_last else "no"}: best S = {S}, '
        f"m = {m}, {best:.2f} s |",
        f"| same, the S = 1 corner (best m) | - | S = {s_first}, m = {m1}: {corner:.2f} s (the optimum is "
        f"{100 * (1 - best / corner):.1f}% lower) |",
        f"| same, the m = 1 corner (best S) | - | S = {s_first}, m = 1: {grid[s_first, 1]:.2f} s; S = {s_last}, m = 1: "
        f"{grid[s_last, 1]:.2f} s |",
        f"| same, the far corner | - | S = {s_last}, m = {m_last}: {grid[s_last, m_last]:.2f} s |",
    ]


def lyapunov_table() -> list[str]:
    """Y_n and Gamma_n over V (``lyapunov/<setting>/figures.txt``, ``results/lyapunov.py``: modelled)."""
    lines = [
        *md.head(
            "| setting | V | mean round delay (s) | worst cluster's mean Gamma_n | Gamma^max "
            "| share of rounds with some "
            "Y_n > 0 | max Y_n |"
        ),
    ]
    for setting, first in (("default", "default (small, N = 2)"), ("selection", "selection (N = 10, J = 4)")):
        fig = name_values(RESULTS / "lyapunov" / setting / "figures.txt")
        for i, v in enumerate(("0.01", "1", "10", "100")):
            lines.append(
                f"| {first if i == 0 else setting} | {v} | {fig[f'mean_delay_s_V{v}']} | "
                f"{fig[f'worst_cluster_mean_gamma_V{v}']} | {float(fig['gamma_max']):g} | "
                f"{fig[f'share_rounds_Y_positive_V{v}']} | {float(fig[f'max_Y_V{v}']):.2f} |"
            )
    return lines


def fig11_uplink_share() -> list[str]:
    """Each policy's mean round split into the slowest selected CU's tau^pipe and uplink (``fig11/uplink_share.txt``,
    ``results/fig11_uplink_share.py --seeds 0``: modelled)."""
    fig = name_values(RESULTS / "fig11" / "uplink_share.txt")
    lines = [
        *md.head(
            "| policy (seed 0) | mean round delay (s) | of it tau^pipe (s) | of it uplink (s) | uplink share | CUs "
            "selected per round |"
        ),
    ]
    for policy, name in (
        ("dssra", "DSSRA"),
        ("loss_only", "loss-only"),
        ("delay_only", "delay-only"),
        ("random", "random"),
    ):
        keys = ("mean_delay_s", "mean_pipeline_s", "mean_uplink_s", "uplink_share", "mean_selected")
        lines.append(md.row((name, *(fig[f"{k}_{policy}"] for k in keys))))
    return lines


def fig5_clusters() -> list[str]:
    """Each heterogeneous cluster's optimal (S, m) and delta (``fig5/figures.txt``, ``results/fig5_segments.py``:
    Sub-1 over the system model, modelled); the paper's S and m are its Fig. 5's."""
    fig = name_values(RESULTS / "fig5" / "figures.txt")
    n = sorted(int(k[2:]) for k in fig if k.startswith("S_"))

    clusters = [f"ours, cluster {i}" if i == n[0] else f"cluster {i}" for i in n]

    def row(label: str, paper: str, key: str, fmt: Callable[[str], str] = str, bold: bool = False) -> str:
        cells = [fmt(fig[f"{key}_{i}"]) for i in n]
        return md.row((label, paper, *(f"**{c}**" if bold else c for c in cells)))

    return [
        *md.head(md.row(("paper's metric (BERT, heterogeneous clusters)", "paper", *clusters))),
        row("optimal S", "5 / 4 / 3", "S", bold=True),
        row("optimal m", "14 / 11 / 9", "m"),
        row("pipeline delay at the optimum (s)", "-", "pipeline_s", lambda v: f"{float(v):.2f}"),
        row("best delay with uniform delta over all K (s)", "-", "uniform_best_s", lambda v: f"{float(v):.2f}"),
        row("delta (blocks per device)", "-", "delta"),
    ]


def fig11_bandwidth() -> list[str]:
    """Fig. 11's margins as the uplink bandwidth grows (``fig11/bandwidth/table.md``, ``results/fig11_bandwidth.py``:
    modelled); **bold**: within ``MATCH_PP`` of the paper's margin with its sign."""
    lines = [
        *md.head(
            "| B_n^U scale (MHz) | DSSRA's uplink share | vs loss-only (paper 46.44%) | vs delay-only (15.48%) "
            "| vs random "
            "(7.12%) |"
        ),
    ]
    for cells in table_rows(RESULTS / "fig11" / "bandwidth" / "table.md"):
        if cells[0] == "paper":
            continue
        margins = []
        for cell, paper in zip(cells[3:6], PAPER_FIG11.values()):
            mean = float(cell.split("%")[0])
            margins.append(f"**{cell}**" if verdict(mean, paper).startswith("match") else cell)
        lines.append(f"| {cells[0]} ({cells[1]}) | {cells[2]} | {' | '.join(margins)} |")
    return lines
