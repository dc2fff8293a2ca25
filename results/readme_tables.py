"""The tables of results/README.md that come from kept records, generated into their marked blocks.

``python results/readme_tables.py`` rewrites every block of ``results/README.md`` that lies between a line
``<!-- table:NAME -->`` and a line ``<!-- /table:NAME -->`` with what :data:`TABLES` [NAME] makes of the kept
records; ``tests/test_results_readme_tables.py`` fails when a committed block differs. The prose around a block is
written by hand and cites it. (The claims table has its own block and script, ``results/claims.py``; the testbed
campaign's tables are files of their own, ``results/testbed_paper_tables.py``.)

The trained-budget campaign (``results/trained/runs.csv``, ``trained/grid.md`` and the central references in
``results/trained/jobs/``, all from the records ``results/trained_learning.py`` keeps -- measured): the final
validation metric per method, mean +- sd over seeds 0, 1, 2, over the central recipe's; Figs. 9-10's (S, m) grid;
the paper's learning claims at a glance (the rows of ``trained/learning.md``'s and ``trained/grid.md``'s claims
tables, which that script writes from the records); each part's job count and wall time (the records' own seconds).

Fig. 11 (``results/fig11/policies.csv``, modelled): DSSRA's reduction of the cumulative delay against each
scheduling baseline, the same rule (a miss further than ``MATCH_PP`` with an sd above it also gives the sd).

Fig. 5, Fig. 11's uplink share and bandwidth sensitivity and the Lyapunov settings come from the ``name: value``
files their scripts keep (``fig5/figures.txt``, ``fig11/uplink_share.txt``, ``lyapunov/<setting>/figures.txt``) or
the table its script keeps (``fig11/bandwidth/table.md``, ``fig7_8/device_spread_<task>_paper_size/table.md``;
Table III's memory from ``fig7_8/<folder>/table.md``).

Figs. 7-8 (``results/fig7_8/<folder>/methods.csv``: the planner over the system model, 50 rounds, seeds 0, 1, 2 --
modelled): CollaPipe's reduction against a baseline is ``100 (1 - ours / theirs)`` per seed, mean +- sd over the
seeds (as ``results/fig7_8_methods.py`` computes it). A margin *matches* the paper's when it has the paper's sign
and lies within ``MATCH_PP`` percentage points of it, else it is a *miss* (by sign, or by its distance).
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent
README = RESULTS / "README.md"
FIG7_8 = RESULTS / "fig7_8"
MATCH_PP = 10.0
BASELINE_NAMES = {"vanilla_fl": "VanillaFL", "titanic": "TITANIC", "pipeline": "PipeLine", "collapipe_no_ss": "w/o SS"}
# Section VI on Figs. 7-8: CollaPipe's computation delay below each baseline's (w/o SS: +22.45% latency without
# segment scheduling, i.e. 22.45 / 122.45 below it); Fig. 8 also gives VanillaFL 29.98% below PipeLine
PAPER = {"vanilla_fl": 15.09, "titanic": 18.94, "pipeline": 40.55, "collapipe_no_ss": 100 * 22.45 / 122.45}
PAPER_VANILLA_VS_PIPELINE = 29.98
SIZES = {  # task: (the paper's model size folder, the small model folder)
    "translation": ("translation_paper_size", "translation"),
    "classification": ("classification_paper_size", "classification"),
    "ner": ("ner_paper_size", "ner"),
}
MODELS = {
    "translation_paper_size": "transformer_paper",
    "classification_paper_size": "bert_base",
    "ner_paper_size": "bert_base",
    "translation": "transformer_small",
    "classification": "bert_small",
    "ner": "bert_small",
}


def methods(folder: str) -> dict[str, dict[str, dict[str, float]]]:
    """{method: {seed: {column: value}}} of ``fig7_8/<folder>/methods.csv``."""
    with (FIG7_8 / folder / "methods.csv").open(newline="", encoding="utf-8") as f:
        out: dict[str, dict[str, dict[str, float]]] = {}
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if k not in ("method", "seed")}
            out.setdefault(row["method"], {})[row["seed"]] = values
    return out


def reductions(folder: str, baseline: str, column: str = "compute_s") -> list[float]:
    """CollaPipe's reduction against ``baseline`` per seed, percent."""
    runs = methods(folder)
    ours, theirs = runs["collapipe"], runs[baseline]
    return [100.0 * (1.0 - ours[s][column] / theirs[s][column]) for s in sorted(ours, key=int) if s in theirs]


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def verdict(ours: float, paper: float) -> str:
    """match (distance) / miss (sign) / miss (+-distance), by the module's rule."""
    if (ours > 0) != (paper > 0):
        return "miss (sign)"
    gap = ours - paper
    return f"match ({abs(gap):.1f} pp)" if abs(gap) <= MATCH_PP else f"miss ({gap:+.0f} pp)"


def fig7_8_margins() -> list[str]:
    lines = [
        "| paper's metric and task | paper | ours, paper's model size | verdict | ours, small model | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for fig, task in (("Fig. 7", "translation"), ("Fig. 8", "classification")):
        for baseline, name in BASELINE_NAMES.items():
            cells = []
            for folder in SIZES[task]:
                mean, sd = _mean_sd(reductions(folder, baseline))
                cells += [f"{mean:.2f}% +- {sd:.2f}", verdict(mean, PAPER[baseline])]
            lines.append(f"| {fig} {task}, CollaPipe vs {name} | {PAPER[baseline]:.2f}% | {' | '.join(cells)} |")
    cells = []
    for folder in SIZES["classification"]:
        runs = methods(folder)
        vanilla = statistics.fmean(v["compute_s"] for v in runs["vanilla_fl"].values())
        pipeline = statistics.fmean(v["compute_s"] for v in runs["pipeline"].values())
        margin = 100.0 * (1.0 - vanilla / pipeline)
        cells += [
            f"{margin:.1f}% ({vanilla:.1f} vs {pipeline:.1f} s, means)",
            verdict(margin, PAPER_VANILLA_VS_PIPELINE),
        ]
    lines.append(
        f"| Fig. 8 classification, VanillaFL vs PipeLine | {PAPER_VANILLA_VS_PIPELINE:.2f}% | {' | '.join(cells)} |"
    )
    ner = [" / ".join(f"{_mean_sd(reductions(folder, b))[0]:.2f}" for b in BASELINE_NAMES) for folder in SIZES["ner"]]
    paper = " / ".join(f"{PAPER[b]:.2f}" for b in BASELINE_NAMES)
    lines.append(
        f"| (extra) NER, vs {' / '.join(BASELINE_NAMES.values())} | {paper}% | {ner[0]}% (8 GB devices) | - | "
        f"{ner[1]}% | - |"
    )
    return lines


def _plan_value(value: float, always_decimals: bool) -> str:
    return f"{value:.0f}" if not always_decimals and value == round(value) else f"{value:.2f}"


def fig7_8_compute() -> list[str]:
    order = ("collapipe", "collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES, "collapipe_no_ss": "w/o SS"}
    lines = [f"| task, model | {' | '.join(names[m] for m in order)} |", "|---|" + "---|" * len(order)]
    for sizes in zip(*SIZES.values()):
        for folder in sizes:
            task = folder.removesuffix("_paper_size")
            runs = methods(folder)
            cells = []
            for m in order:
                seeds = runs[m].values()
                mean, sd = _mean_sd([v["compute_s"] for v in seeds])
                S = _plan_value(statistics.fmean(v["mean_S"] for v in seeds), m == "collapipe")
                mm = _plan_value(statistics.fmean(v["mean_m"] for v in seeds), m == "collapipe")
                cells.append(f"{mean:.1f} +- {sd:.1f} (S {S}, m {mm})")
            lines.append(f"| {task}, {MODELS[folder]} | {' | '.join(cells)} |")
    return lines


def fig7_8_round_delay() -> list[str]:
    lines = [
        "| CollaPipe vs | translation (paper size / small) | classification (paper size / small) | ner (paper size / "
        "small) |",
        "|---|---|---|---|",
    ]
    for baseline, name in BASELINE_NAMES.items():
        cells = [
            " / ".join(f"{_mean_sd(reductions(folder, baseline, 'round_delay_s'))[0]:.2f}%" for folder in sizes)
            for sizes in SIZES.values()
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


TRAINED = RESULTS / "trained"
METRIC = {"translation": ("bleu", "BLEU", 2), "classification": ("accuracy", "accuracy", 4), "ner": ("f1", "F1", 3)}
TITLE = {
    "translation": "translation, validation BLEU (whole split)",
    "classification": "classification, validation accuracy",
    "ner": "NER, validation entity F1",
}
TRAINED_ORDER = ("collapipe", "collapipe_no_ss", "titanic", "pipeline", "vanilla_fl")


def central_reference(task: str) -> float:
    """The central recipe's validation metric (``trained/jobs/<task>/central/seed0/central.json``)."""
    record = json.loads((TRAINED / "jobs" / task / "central" / "seed0" / "central.json").read_text(encoding="utf-8"))
    return float(record["val"][METRIC[task][0]])


def trained_final(task: str) -> list[str]:
    """The trained-budget campaign's final validation metric per method (``trained/runs.csv``, part ``methods``)
    beside the central reference; on NER also each seed, the early training loss and the mean plan."""
    with (TRAINED / "runs.csv").open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["task"] == task and r["part"] == "methods" and r["ok"] == "True"]
    _, label, digits = METRIC[task]
    ref = central_reference(task)
    ref_text = f"{ref:.{digits}f}"
    head = f"| {TITLE[task]} | seeds | final {label}, mean +- sd | over the central reference ({ref_text}) |"
    extra = task == "ner"
    if extra:
        head += " seed 0 / 1 / 2 | mean train loss, rounds 1-10 | mean S / m |"
    lines = [head, "|---|---|---|---|" + ("---|---|---|" if extra else "")]
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES}
    for method in TRAINED_ORDER:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: int(r["seed"]))
        finals = [float(r["final_metric"]) for r in mine]
        mean, sd = _mean_sd(finals)
        line = (
            f"| {names[method]} | {', '.join(r['seed'] for r in mine)} | {mean:.{digits}f} +- {sd:.{digits}f} | "
            f"{mean / ref:.3f}x |"
        )
        if extra:
            per_seed = " / ".join(f"{x:.{digits}f}" for x in finals)
            early = statistics.fmean(float(r["early_loss"]) for r in mine)
            S = statistics.fmean(float(r["S"]) for r in mine)
            m = statistics.fmean(float(r["m"]) for r in mine)
            line += f" {per_seed} | {early:.3f} | {S:.2f} / {m:.2f} |"
        lines.append(line)
    return lines


PAPER_FIG11 = {"loss_only": 46.44, "delay_only": 15.48, "random": 7.12}  # Section VI on Fig. 11, DSSRA's reductions


def fig11_policies() -> list[str]:
    """DSSRA's total-delay reduction against each scheduling baseline (``fig11/policies.csv``: the planner over
    the system model, 150 rounds, seeds 0, 1, 2 -- modelled), per seed then mean +- sd, with the worst cluster's
    mean Gamma_n (C10)."""
    with (RESULTS / "fig11" / "policies.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by = {(r["policy"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["policy"] == "dssra"}, key=int)
    lines = [
        "| paper's metric and task: total delay reduction, DSSRA vs | paper | ours, mean +- sd | verdict | worst "
        "cluster's mean Gamma_n (DSSRA / it) |",
        "|---|---|---|---|---|",
    ]
    for policy, paper in PAPER_FIG11.items():
        red = [
            100.0 * (1.0 - float(by["dssra", s]["cumulative_delay_s"]) / float(by[policy, s]["cumulative_delay_s"]))
            for s in seeds
        ]
        mean, sd = _mean_sd(red)
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
    with (RESULTS / "fig4" / "grid.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    grid = {(int(k[1:]), int(r["m"])): float(v) for r in rows for k, v in r.items() if k.startswith("S")}
    (S, m), best = min(grid.items(), key=lambda kv: kv[1])
    s_values, m_values = sorted({k[0] for k in grid}), sorted({k[1] for k in grid})
    m1 = min(m_values, key=lambda mm: grid[1, mm])
    s_first, s_last, m_last = s_values[0], s_values[-1], m_values[-1]
    corner = grid[s_first, m1]
    return [
        "| paper's metric and task | paper | ours |",
        "|---|---|---|",
        '| round time over S x m, even delta, Transformer: is there an interior optimal (S, m)? | "there is always an '
        f'optimal S and m" | {"yes" if s_first < S < s_last and m_values[0] < m < m_last else "no"}: best S = {S}, '
        f"m = {m}, {best:.2f} s |",
        f"| same, the S = 1 corner (best m) | - | S = {s_first}, m = {m1}: {corner:.2f} s (the optimum is "
        f"{100 * (1 - best / corner):.1f}% lower) |",
        f"| same, the m = 1 corner (best S) | - | S = {s_first}, m = 1: {grid[s_first, 1]:.2f} s; S = {s_last}, m = 1: "
        f"{grid[s_last, 1]:.2f} s |",
        f"| same, the far corner | - | S = {s_last}, m = {m_last}: {grid[s_last, m_last]:.2f} s |",
    ]


def figures(path: Path) -> dict[str, str]:
    """A script's ``name: value`` lines (``figures.txt``, ``uplink_share.txt``)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def lyapunov_table() -> list[str]:
    """Y_n and Gamma_n over V (``lyapunov/<setting>/figures.txt``, ``results/lyapunov.py``: modelled)."""
    lines = [
        "| setting | V | mean round delay (s) | worst cluster's mean Gamma_n | Gamma^max | share of rounds with some "
        "Y_n > 0 | max Y_n |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting, first in (("default", "default (small, N = 2)"), ("selection", "selection (N = 10, J = 4)")):
        fig = figures(RESULTS / "lyapunov" / setting / "figures.txt")
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
    fig = figures(RESULTS / "fig11" / "uplink_share.txt")
    lines = [
        "| policy (seed 0) | mean round delay (s) | of it tau^pipe (s) | of it uplink (s) | uplink share | CUs "
        "selected per round |",
        "|---|---|---|---|---|---|",
    ]
    for policy, name in (
        ("dssra", "DSSRA"),
        ("loss_only", "loss-only"),
        ("delay_only", "delay-only"),
        ("random", "random"),
    ):
        keys = ("mean_delay_s", "mean_pipeline_s", "mean_uplink_s", "uplink_share", "mean_selected")
        lines.append(f"| {name} | " + " | ".join(fig[f"{k}_{policy}"] for k in keys) + " |")
    return lines


def fig5_clusters() -> list[str]:
    """Each heterogeneous cluster's optimal (S, m) and delta (``fig5/figures.txt``, ``results/fig5_segments.py``:
    Sub-1 over the system model, modelled); the paper's S and m are its Fig. 5's."""
    fig = figures(RESULTS / "fig5" / "figures.txt")
    n = sorted(int(k[2:]) for k in fig if k.startswith("S_"))

    def row(label: str, paper: str, key: str, fmt: Callable[[str], str] = str, bold: bool = False) -> str:
        cells = [fmt(fig[f"{key}_{i}"]) for i in n]
        return f"| {label} | {paper} | " + " | ".join(f"**{c}**" if bold else c for c in cells) + " |"

    return [
        "| paper's metric (BERT, heterogeneous clusters) | paper | "
        + " | ".join(f"ours, cluster {i}" if i == n[0] else f"cluster {i}" for i in n)
        + " |",
        "|---|---|" + "---|" * len(n),
        row("optimal S", "5 / 4 / 3", "S", bold=True),
        row("optimal m", "14 / 11 / 9", "m"),
        row("pipeline delay at the optimum (s)", "-", "pipeline_s", lambda v: f"{float(v):.2f}"),
        row("best delay with uniform delta over all K (s)", "-", "uniform_best_s", lambda v: f"{float(v):.2f}"),
        row("delta (blocks per device)", "-", "delta"),
    ]


def markdown_rows(path: Path) -> list[list[str]]:
    """The cells of every data row of the first table in a kept ``table.md`` (header and rule skipped)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def fig11_bandwidth() -> list[str]:
    """Fig. 11's margins as the uplink bandwidth grows (``fig11/bandwidth/table.md``, ``results/fig11_bandwidth.py``:
    modelled); **bold**: within ``MATCH_PP`` of the paper's margin with its sign."""
    lines = [
        "| B_n^U scale (MHz) | DSSRA's uplink share | vs loss-only (paper 46.44%) | vs delay-only (15.48%) | vs random "
        "(7.12%) |",
        "|---|---|---|---|---|",
    ]
    for cells in markdown_rows(RESULTS / "fig11" / "bandwidth" / "table.md"):
        if cells[0] == "paper":
            continue
        margins = []
        for cell, paper in zip(cells[3:6], PAPER_FIG11.values()):
            mean = float(cell.split("%")[0])
            margins.append(f"**{cell}**" if verdict(mean, paper).startswith("match") else cell)
        lines.append(f"| {cells[0]} ({cells[1]}) | {cells[2]} | {' | '.join(margins)} |")
    return lines


def trained_grid(task: str) -> list[str]:
    """Figs. 9-10's (S, m) grid at the trained budget, seed 0 (``trained/grid.md``, which
    ``results/trained_learning.py --report`` writes from the kept records: measured)."""
    text = (TRAINED / "grid.md").read_text(encoding="utf-8")
    section = text.split(f"## {task}: learning over (S, m)", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.split("\n### ", 1)[0].splitlines() if line.startswith("| ") and line[2].isdigit()]
    _, label, _ = METRIC[task]
    metric_digits, loss_digits, gap_digits = (2, 3, 3) if task == "translation" else (3, 4, 4)
    lines = [
        f"| S | m | final {label} | final train loss | largest per-round loss gap to S = 1, m = 1 | modelled delay "
        "(s) |",
        "|---|---|---|---|---|---|",
    ]
    with (TRAINED / "runs.csv").open(newline="", encoding="utf-8") as f:
        full = {
            (int(float(r["S"])), int(float(r["m"]))): r
            for r in csv.DictReader(f)
            if r["task"] == task and r["part"] == "grid"
        }
    for row in rows:  # the gap from grid.md (3 significant digits), the rest at full precision from runs.csv
        S, m, _, _, gap = (c.strip() for c in row.strip("|").split("|")[:5])
        run = full[int(S), int(m)]
        gap_text = "0" if float(gap) == 0 else f"{float(gap):.{gap_digits}f}"
        metric, loss = float(run["final_metric"]), float(run["final_loss"])
        lines.append(
            f"| {S} | {m} | {metric:.{metric_digits}f} | {loss:.{loss_digits}f} | {gap_text} | "
            f"{float(run['delay_s']):,.0f} |"
        )
    return lines


TASK_NAMES = {"translation": "translation", "classification": "classification", "ner": "NER"}


def _section_table(text: str, heading: str) -> list[list[str]]:
    """The data rows (cells) of the first table under the markdown heading line ``heading``; a heading that is not
    there is a ValueError naming it (the generated file changed shape)."""
    lines = text.splitlines()
    if heading not in lines:
        raise ValueError(
            f"no heading {heading!r}: regenerate results/trained/ (python results/trained_learning.py ROOT --report)"
        )
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]


def trained_claims() -> list[str]:
    """The paper's learning claims at a glance: every row of ``trained/learning.md``'s "the paper's margins against
    the noise" tables (CollaPipe minus a baseline, paired by seed) and of ``trained/grid.md``'s "the paper's (S, m)
    claims beside the grid" tables (one seed, against the seed sd of w/o SS), both written by
    ``results/trained_learning.py --report`` from the kept records (measured)."""
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES}
    learning = (TRAINED / "learning.md").read_text(encoding="utf-8")
    grid = (TRAINED / "grid.md").read_text(encoding="utf-8")
    lines = [
        "| figure | task | paper | compared | ours | noise | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in ("translation", "classification", "ner"):
        for figure, paper, baseline, gap, floor, verdict_text in _section_table(
            learning, f"### {task}: the paper's margins against the noise"
        ):
            lines.append(
                f"| {figure} | {TASK_NAMES[task]} | {paper} | CollaPipe minus {names.get(baseline, baseline)} | "
                f"{gap} | same-seed floor {floor} | {verdict_text} |"
            )
    for task in ("translation", "ner"):
        for figure, paper, ours, noise, verdict_text in _section_table(
            grid, f"### {task}: the paper's (S, m) claims beside the grid"
        ):
            lines.append(
                f"| {figure} | {TASK_NAMES[task]} | {paper} | (S, m) grid, w/o SS, seed 0 | {ours} | {noise} | "
                f"{verdict_text} |"
            )
    return lines


TRAINED_PARTS = ("methods", "central", "repeat", "grid")


def trained_jobs() -> list[str]:
    """The trained-budget campaign's job count and wall time per task and part, from each kept job's record
    (``summary.json``'s ``wall_s``, a central job's ``total_seconds``: ``trained_learning.seconds_taken``)."""
    if str(RESULTS) not in sys.path:  # the sibling script, loaded once
        sys.path.insert(0, str(RESULTS))
    import trained_learning

    taken: dict[tuple[str, str], list[float]] = {}
    for job in trained_learning.jobs():
        seconds = trained_learning.seconds_taken(TRAINED / "jobs" / job.name)
        if seconds is not None:
            taken.setdefault((job.task, job.name.split("/")[1]), []).append(seconds)
    lines = [
        "| part | jobs | hours here | one job, seconds (fastest - slowest) |",
        "|---|---|---|---|",
    ]
    for task in ("translation", "classification", "ner"):
        parts = [p for p in TRAINED_PARTS if (task, p) in taken]
        spans = []
        for part in parts:
            lo, hi = min(taken[task, part]), max(taken[task, part])
            spans.append(f"{lo:,.0f}" if len(taken[task, part]) == 1 else f"{lo:,.0f}-{hi:,.0f}")
        lines.append(
            f"| {TASK_NAMES[task]}: {' / '.join(parts)} | {' / '.join(str(len(taken[task, p])) for p in parts)} | "
            f"{' / '.join(f'{sum(taken[task, p]) / 3600:.2f}' for p in parts)} | {' / '.join(spans)} |"
        )
    total = [s for values in taken.values() for s in values]
    lines.append(f"| all | {len(total)} | {sum(total) / 3600:.1f} | {min(total):,.0f}-{max(total):,.0f} |")
    return lines


PAPER_TABLE3 = {
    "vanilla_fl": "~5-6 G (whole model) / Large",
    "pipeline": "~5-6 G / Small",
    "titanic": "Adapted / Large",
    "collapipe": "Adapted / Small",
}


def table3_memory() -> list[str]:
    """Table III: the largest modelled per-device memory (C7's count) and the data users per round of every
    method (the second table of ``fig7_8/<folder>/table.md``, ``results/fig7_8_methods.py``: modelled), and each
    method's largest per-device memory below VanillaFL's."""
    folders = ("classification_paper_size", "ner_paper_size", "classification")
    tables = {}
    for folder in folders:
        rows = markdown_rows(FIG7_8 / folder / "table.md")
        tables[folder] = {r[0]: (float(r[4]), float(r[5])) for r in rows if len(r) == 6 and r[0] in PAPER_TABLE3}
    lines = [
        "| method | paper: memory / data users | ours, BERT-base classification | ours, BERT-base NER | ours, "
        "bert_small classification | largest device below VanillaFL's (the three columns) |",
        "|---|---|---|---|---|---|",
    ]
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES}
    for method, paper in PAPER_TABLE3.items():
        cells = []
        for folder in folders:
            mib, users = tables[folder][method]
            cells.append(f"{mib:.0f} MiB / {users:g}")
        below = " / ".join(f"{100 * (1 - tables[f][method][0] / tables[f]['vanilla_fl'][0]):.1f}%" for f in folders)
        lines.append(f"| {names[method]} | {paper} | {' | '.join(cells)} | {below} |")
    return lines


def fig7_8_device_spread() -> list[str]:
    """Figs. 7-8's margins as the device spread narrows (``fig7_8/device_spread_<task>_paper_size/table.md``,
    ``results/fig7_8_device_spread.py``: modelled); **bold**: a match by the module's rule."""
    order = ("collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
    per_task = {
        task: markdown_rows(FIG7_8 / f"device_spread_{task}_paper_size" / "table.md")
        for task in ("translation", "classification")
    }

    def margins(cells: list[str]) -> str:
        out = []
        for cell, baseline in zip(cells[4:8], order):
            mean = float(cell.split("%")[0])
            text = f"{mean:.1f}"
            out.append(f"**{text}**" if verdict(mean, PAPER[baseline]).startswith("match") else text)
        return " / ".join(out) + "%"

    lines = [
        "| a | slowest device vs its cluster's mean | Fig. 7 translation: vs w/o SS / VanillaFL / TITANIC / PipeLine | "
        "Fig. 8 classification: the same |",
        "|---|---|---|---|",
    ]
    for t_row, c_row in zip(per_task["translation"], per_task["classification"]):
        if t_row[0] == "paper":
            continue
        a = f"{t_row[0]} (Table II)" if t_row[0] == "0" else f"{t_row[0]} (narrow)" if t_row[0] == "1" else t_row[0]
        lines.append(f"| {a} | {t_row[3]} | {margins(t_row)} | {margins(c_row)} |")
    paper = " / ".join(f"{PAPER[b]:.2f}" for b in order)
    lines.append(f"| paper | | {paper}% | the same |")
    return lines


TABLES: dict[str, Callable[[], list[str]]] = {
    "fig7_8_device_spread": fig7_8_device_spread,
    "table3_memory": table3_memory,
    "trained_grid_translation": lambda: trained_grid("translation"),
    "trained_grid_ner": lambda: trained_grid("ner"),
    "fig11_bandwidth": fig11_bandwidth,
    "fig5_clusters": fig5_clusters,
    "lyapunov": lyapunov_table,
    "fig11_uplink_share": fig11_uplink_share,
    "fig4_grid": fig4_grid,
    "fig11_policies": fig11_policies,
    "trained_translation": lambda: trained_final("translation"),
    "trained_classification": lambda: trained_final("classification"),
    "trained_ner": lambda: trained_final("ner"),
    "trained_claims": trained_claims,
    "trained_jobs": trained_jobs,
    "fig7_8_margins": fig7_8_margins,
    "fig7_8_compute": fig7_8_compute,
    "fig7_8_round_delay": fig7_8_round_delay,
}


def render(readme: str) -> str:
    """``readme`` with every marked block regenerated (indented as its markers are, e.g. inside a list item); a
    block without its end marker, or a name not in TABLES, is a ValueError naming it."""
    for indent, name in re.findall(r"^( *)<!-- table:(\S+) -->$", readme, flags=re.M):
        if name not in TABLES:
            raise ValueError(f"results/README.md marks a table {name!r} that results/readme_tables.py does not make")
        begin, end = f"{indent}<!-- table:{name} -->\n", f"{indent}<!-- /table:{name} -->"
        head, rest = readme.split(begin, 1)
        if end not in rest:
            raise ValueError(f"results/README.md: the block {name!r} has no {end.strip()} line")
        tail = rest.split(end, 1)[1]
        body = "".join(f"{indent}{line}\n" for line in TABLES[name]())
        readme = head + begin + body + end + tail
    return readme


def main() -> int:
    text = README.read_text(encoding="utf-8")
    new = render(text)
    README.write_text(new, encoding="utf-8")
    print(f"{README}: {'unchanged' if new == text else 'tables regenerated'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
