"""The trained-budget campaign (``results/trained/runs.csv``, ``trained/grid.md``, ``trained/learning.md`` and the
central references in ``results/trained/jobs/``, all from the records ``results/trained_learning.py`` keeps --
measured)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from reportlib import markdown as md
from reportlib.markdown import section_rows
from reportlib.records import read_csv, read_json
from reportlib.stats import mean_sd

from readme_sections.verdict import BASELINE_NAMES

RESULTS = Path(__file__).resolve().parent.parent
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
    record = read_json(TRAINED / "jobs" / task / "central" / "seed0" / "central.json")
    return float(record["val"][METRIC[task][0]])


def trained_final(task: str) -> list[str]:
    """The trained-budget campaign's final validation metric per method (``trained/runs.csv``, part ``methods``)
    beside the central reference; on NER also each seed, the early training loss and the mean plan."""
    rows = [
        r for r in read_csv(TRAINED / "runs.csv") if r["task"] == task and r["part"] == "methods" and r["ok"] == "True"
    ]
    _, label, digits = METRIC[task]
    ref = central_reference(task)
    ref_text = f"{ref:.{digits}f}"
    head = f"| {TITLE[task]} | seeds | final {label}, mean +- sd | over the central reference ({ref_text}) |"
    extra = task == "ner"
    if extra:
        head += " seed 0 / 1 / 2 | mean train loss, rounds 1-10 | mean S / m |"
    lines = md.head(head)
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES}
    for method in TRAINED_ORDER:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: int(r["seed"]))
        finals = [float(r["final_metric"]) for r in mine]
        mean, sd = mean_sd(finals)
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


def trained_grid(task: str) -> list[str]:
    """Figs. 9-10's (S, m) grid at the trained budget, seed 0 (``trained/grid.md``, which
    ``results/trained_learning.py --report`` writes from the kept records: measured)."""
    text = (TRAINED / "grid.md").read_text(encoding="utf-8")
    section = text.split(f"## {task}: learning over (S, m)", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.split("\n### ", 1)[0].splitlines() if line.startswith("| ") and line[2].isdigit()]
    _, label, _ = METRIC[task]
    metric_digits, loss_digits, gap_digits = (2, 3, 3) if task == "translation" else (3, 4, 4)
    lines = [
        *md.head(
            f"| S | m | final {label} | final train loss | largest per-round loss gap to S = 1, m = 1 | modelled delay "
            "(s) |"
        ),
    ]
    grid_runs = [r for r in read_csv(TRAINED / "runs.csv") if r["task"] == task and r["part"] == "grid"]
    full = {(int(float(r["S"])), int(float(r["m"]))): r for r in grid_runs}
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
    """The data rows of the table under ``heading`` of a file ``results/trained_learning.py --report`` writes."""
    return section_rows(text, heading, "regenerate results/trained/ (python results/trained_learning.py ROOT --report)")


def trained_claims() -> list[str]:
    """The paper's learning claims at a glance: every row of ``trained/learning.md``'s "the paper's margins against
    the noise" tables (CollaPipe minus a baseline, paired by seed) and of ``trained/grid.md``'s "the paper's (S, m)
    claims beside the grid" tables (one seed, against the seed sd of w/o SS), both written by
    ``results/trained_learning.py --report`` from the kept records (measured)."""
    names = {"collapipe": "CollaPipe", **BASELINE_NAMES}
    learning = (TRAINED / "learning.md").read_text(encoding="utf-8")
    grid = (TRAINED / "grid.md").read_text(encoding="utf-8")
    lines = [
        *md.head("| figure | task | paper | compared | ours | noise | verdict |"),
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
        *md.head("| part | jobs | hours here | one job, seconds (fastest - slowest) |"),
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
