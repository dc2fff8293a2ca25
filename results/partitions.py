"""Non-IID data for every task: one federated run per partition kind (docs/partitions.md), the final validation
metric beside the IID run's.

Every job is one ``collapipe run`` with the task's defaults (``federation=small``: N = 2 clusters, 10 rounds of
20 local steps) and ``task.partition`` set to one kind: ``iid``; ``quantity`` (linear: cluster 1 holds twice
cluster 0's share); ``dirichlet`` (alpha 0.5 over the task's partition labels: the class for classification, a
sentence's dominant entity type for NER, the source-length quartile for translation); ``pathological`` (two of
the 15 classes per cluster, classification only); ``domain`` (one corpus per cluster: Toutiao vs the TNEWS
supplement, People's Daily vs the MSRA supplement; translation has one corpus). The metric is each task's on
the whole validation split of its main corpus (BLEU, accuracy, entity F1).

Each job is skipped when its run folder already has ``summary.json``, so the campaign runs in pieces and reruns
after an interruption; it prints what is done and what is left, and the table is rebuilt from whatever has
finished. Usage: ``python results/partitions.py ROOT [--tasks translation classification ner] [--seed 0]``;
``--report`` only rebuilds the table (``results/partitions/README.md``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "partitions"
METRICS = {"translation": "bleu", "classification": "accuracy", "ner": "f1"}
EXTRA = {
    "classification": "toutiao/supplementary_tnews_fewclue/tnews_fewclue_labeled.txt",
    "ner": "chinese_ner/supplementary_msra/msra_bio.txt",
}
KINDS = {
    "translation": ("iid", "quantity", "dirichlet"),
    "classification": ("iid", "quantity", "dirichlet", "pathological", "domain"),
    "ner": ("iid", "quantity", "dirichlet", "domain"),
}


@dataclass(frozen=True)
class Job:
    task: str
    kind: str
    seed: int

    @property
    def name(self) -> str:
        return f"s{self.seed}/{self.task}_{self.kind}"

    @property
    def overrides(self) -> str:
        out = f"task.partition={self.kind} seed={self.seed} checkpoint=false"
        if self.kind == "domain":
            out += f" task.extra_train_files=[{EXTRA[self.task]}]"
        return out


def jobs(tasks: list[str], seed: int) -> list[Job]:
    return [Job(task, kind, seed) for task in tasks for kind in KINDS[task]]


def run_job(root: Path, job: Job) -> bool:
    return campaign.run_job(root, job.name, job.overrides, flat=f"task='{job.task}'")


def final_metric(folder: Path, metric: str) -> tuple[float | None, dict, float | None]:
    """The last evaluated round's validation metric, the last record's partitions and, for a domain run, the
    metric on the extra corpus's own held-out validation (``val_<metric>_domain1``; None: not finished / none)."""
    if not (folder / "summary.json").is_file():
        return None, {}, None
    records = read_jsonl(folder / "rounds.jsonl")
    scored = [r for r in records if f"val_{metric}" in r]
    value = float(scored[-1][f"val_{metric}"]) if scored else None
    domain = scored[-1].get(f"val_{metric}_domain1") if scored else None
    return value, records[-1].get("partitions", {}), None if domain is None else float(domain)


def sizes(partitions: dict) -> str:
    """Each cluster's |D_n| and its largest label's share."""
    cells = []
    for n in sorted(partitions, key=int):
        p = partitions[n]
        top = max(p["labels"]) / p["examples"] if p.get("labels") and p["examples"] else float("nan")
        cells.append(f"{p['examples']} ({top:.0%})")
    return " / ".join(cells)


def report(root: Path, tasks: list[str], seed: int) -> str:
    lines = [
        *md.head(
            "| task | partition | final validation metric | vs IID | the extra domain's own validation | "
            "clusters: examples (largest label's share) |"
        ),
    ]
    for task in tasks:
        metric = METRICS[task]
        iid, _, _ = final_metric(root / Job(task, "iid", seed).name, metric)
        for kind in KINDS[task]:
            value, parts, domain = final_metric(root / Job(task, kind, seed).name, metric)
            if value is None:
                lines.append(f"| {task} | {kind} | not run yet | | | |")
                continue
            versus = f"{value - iid:+.3f}" if iid is not None and kind != "iid" else ""
            own = "" if domain is None else f"{metric} {domain:.3f}"
            lines.append(f"| {task} | {kind} | {metric} {value:.3f} | {versus} | {own} | {sizes(parts)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of the campaign's runs (kept between pieces)")
    parser.add_argument("--tasks", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", action="store_true", help="only rebuild the table from the finished runs")
    args = parser.parse_args(argv)
    todo = jobs(args.tasks, args.seed)
    done = [j for j in todo if (args.root / j.name / "summary.json").is_file()]
    print(f"{len(done)} of {len(todo)} jobs done, {len(todo) - len(done)} left", flush=True)
    failed = 0
    if not args.report:
        for job in todo:
            failed += not run_job(args.root, job)
    table = report(args.root, args.tasks, args.seed)
    md.write(
        OUT / "README.md",
        "# Partition kinds per task (results/partitions.py)\n\n"
        f"`python results/partitions.py ROOT --seed {args.seed}`; defaults otherwise "
        "(federation=small: N = 2, 10 rounds of 20 local steps).\n\n" + table,
    )
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
