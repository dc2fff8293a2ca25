"""Figs. 7-8 and Table III (``results/fig7_8/<folder>/``: the planner over the system model, 50 rounds, seeds 0, 1, 2
-- modelled): CollaPipe's reduction against a baseline is ``100 (1 - ours / theirs)`` per seed, mean +- sd over the
seeds (as ``results/fig7_8_methods.py`` computes it)."""

from __future__ import annotations

import statistics
from pathlib import Path

from reportlib import markdown as md
from reportlib.markdown import table_rows
from reportlib.records import read_csv
from reportlib.stats import mean_sd

from readme_sections.verdict import BASELINE_NAMES, PAPER, PAPER_VANILLA_VS_PIPELINE, verdict

FIG7_8 = Path(__file__).resolve().parent.parent / "fig7_8"
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
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row in read_csv(FIG7_8 / folder / "methods.csv"):
        values = {k: float(v) for k, v in row.items() if k not in ("method", "seed")}
        out.setdefault(row["method"], {})[row["seed"]] = values
    return out


def reductions(folder: str, baseline: str, column: str = "compute_s") -> list[float]:
    """CollaPipe's reduction against ``baseline`` per seed, percent."""
    runs = methods(folder)
    ours, theirs = runs["collapipe"], runs[baseline]
    return [100.0 * (1.0 - ours[s][column] / theirs[s][column]) for s in sorted(ours, key=int) if s in theirs]


def fig7_8_margins() -> list[str]:
    lines = [
        *md.head(
            "| paper's metric and task | paper | ours, paper's model size | verdict | ours, small model | verdict |"
        ),
    ]
    for fig, task in (("Fig. 7", "translation"), ("Fig. 8", "classification")):
        for baseline, name in BASELINE_NAMES.items():
            cells = []
            for folder in SIZES[task]:
                mean, sd = mean_sd(reductions(folder, baseline))
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
    ner = [" / ".join(f"{mean_sd(reductions(folder, b))[0]:.2f}" for b in BASELINE_NAMES) for folder in SIZES["ner"]]
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
    lines = md.head(md.row(("task, model", *(names[m] for m in order))))
    for sizes in zip(*SIZES.values()):
        for folder in sizes:
            task = folder.removesuffix("_paper_size")
            runs = methods(folder)
            cells = []
            for m in order:
                seeds = runs[m].values()
                mean, sd = mean_sd([v["compute_s"] for v in seeds])
                S = _plan_value(statistics.fmean(v["mean_S"] for v in seeds), m == "collapipe")
                mm = _plan_value(statistics.fmean(v["mean_m"] for v in seeds), m == "collapipe")
                cells.append(f"{mean:.1f} +- {sd:.1f} (S {S}, m {mm})")
            lines.append(f"| {task}, {MODELS[folder]} | {' | '.join(cells)} |")
    return lines


def fig7_8_round_delay() -> list[str]:
    lines = [
        *md.head(
            "| CollaPipe vs | translation (paper size / small) | classification (paper size / small) "
            "| ner (paper size / "
            "small) |"
        ),
    ]
    for baseline, name in BASELINE_NAMES.items():
        cells = [
            " / ".join(f"{mean_sd(reductions(folder, baseline, 'round_delay_s'))[0]:.2f}%" for folder in sizes)
            for sizes in SIZES.values()
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
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
        rows = table_rows(FIG7_8 / folder / "table.md")
        tables[folder] = {r[0]: (float(r[4]), float(r[5])) for r in rows if len(r) == 6 and r[0] in PAPER_TABLE3}
    lines = [
        *md.head(
            "| method | paper: memory / data users | ours, BERT-base classification | ours, BERT-base NER | ours, "
            "bert_small classification | largest device below VanillaFL's (the three columns) |"
        ),
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
        task: table_rows(FIG7_8 / f"device_spread_{task}_paper_size" / "table.md")
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
        *md.head(
            "| a | slowest device vs its cluster's mean "
            "| Fig. 7 translation: vs w/o SS / VanillaFL / TITANIC / PipeLine | Fig. 8 classification: the same |"
        ),
    ]
    for t_row, c_row in zip(per_task["translation"], per_task["classification"]):
        if t_row[0] == "paper":
            continue
        a = f"{t_row[0]} (Table II)" if t_row[0] == "0" else f"{t_row[0]} (narrow)" if t_row[0] == "1" else t_row[0]
        lines.append(f"| {a} | {t_row[3]} | {margins(t_row)} | {margins(c_row)} |")
    paper = " / ".join(f"{PAPER[b]:.2f}" for b in order)
    lines.append(f"| paper | | {paper}% | the same |")
    return lines
