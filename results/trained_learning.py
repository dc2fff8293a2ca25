"""The learning figures (Figs. 6, 9, 10) at budgets where the models learn, as a campaign that survives
interruptions.

    python results/trained_learning.py ROOT              # run every job not finished yet, in order
    python results/trained_learning.py ROOT --status     # only say what is done (with its time) and what is left
    python results/trained_learning.py ROOT --report     # only rebuild results/trained/ from the finished jobs
    python results/trained_learning.py ROOT --only translation/methods/seed0   # jobs whose name starts so

Every job is one ``collapipe run`` (the Flower simulation path) into ``ROOT/<job name>/``, skipped once that
folder holds ``summary.json``; a job cut short is rerun from its start. After the jobs (or with ``--report``)
``results/fig6_learning.py`` rebuilds ``results/trained/`` (``learning.md``, ``grid.md``, ``runs.csv``, the
figures) from whatever has finished, so the campaign can be run a few jobs at a time.

The budget is ``federation=long`` for every task (N = 2 clusters, 30 rounds of 25 local steps: about the central
translation recipe's sample budget; on NER it carries the central NER recipe, conf/recipe/ner_long.yaml), with
``runtime.backend=local`` (a cluster's devices in its CU's process: the learning does not depend on the backend,
and Ray actors cost start-up on 2 cores). Jobs, in the order they run, so that a campaign cut short still has
seed 0 of every task and method first:

- ``<task>/methods/seed<s>/<method>``: the five methods, seeds 0, 1, 2;
- ``translation/repeat/seed0_collapipe``: CollaPipe at seed 0 again, the same-seed noise floor (only the order
  in which the server's decoder takes the CUs' steps differs);
- ``<task>/grid/S<S>_m<m>``, translation and NER: Figs. 9-10, a uniform split over S devices with m fixed
  (``method=collapipe_no_ss network.devices_per_cluster=S method.fixed_m=m``), seed 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "trained"
TASKS = ("translation", "classification", "ner")
METHODS = ("collapipe", "collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
SEEDS = (0, 1, 2)
GRID = ((1, 1), (1, 4), (2, 2), (3, 1), (3, 4))  # (S, m): the corners and S = m = 2 (Fig. 9's optimum)
GRID_TASKS = ("translation", "ner")
BUDGET = "federation=long runtime.backend=local checkpoint=false"


@dataclass(frozen=True)
class Job:
    name: str  # ROOT/<name> is its run folder
    task: str
    overrides: str


def jobs() -> list[Job]:
    """Every job of the campaign, in the order it runs (module docstring)."""
    out = [
        Job(f"{task}/methods/seed{seed}/{method}", task, f"{BUDGET} method={method} seed={seed}")
        for seed in SEEDS
        for task in TASKS
        for method in METHODS
    ]
    out.append(Job("translation/repeat/seed0_collapipe", "translation", f"{BUDGET} method=collapipe seed=0"))
    for task in GRID_TASKS:
        for s, m in GRID:
            grid = f"method=collapipe_no_ss network.devices_per_cluster={s} method.fixed_m={m} seed=0"
            out.append(Job(f"{task}/grid/S{s}_m{m}", task, f"{BUDGET} {grid}"))
    return out


def seconds_taken(folder: Path) -> float | None:
    """The finished run's wall-clock seconds (summary.json), None when it has not finished."""
    summary = folder / "summary.json"
    if not summary.is_file():
        return None
    return float(json.loads(summary.read_text()).get("wall_s") or 0.0)


def status(root: Path, todo: list[Job]) -> tuple[list[Job], list[Job]]:
    """(done, left), printed with each finished job's seconds and the total so far."""
    done = [j for j in todo if (root / j.name / "summary.json").is_file()]
    left = [j for j in todo if j not in done]
    spent = 0.0
    for job in done:
        took = seconds_taken(root / job.name) or 0.0
        spent += took
        print(f"done  {job.name} ({took:.0f} s)")
    for job in left:
        print(f"left  {job.name}")
    print(f"{len(done)} of {len(todo)} jobs done ({spent / 3600:.1f} h of runs), {len(left)} left", flush=True)
    return done, left


def report(root: Path) -> int:
    """Rebuild results/trained/ from the finished jobs with results/fig6_learning.py (its figures printed)."""
    import fig6_learning

    fig6_learning.main([str(root), "--out", str(OUT)])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of the campaign's runs (kept between pieces)")
    parser.add_argument("--only", default="", help="run only the jobs whose name starts with this")
    parser.add_argument("--status", action="store_true", help="only print what is done and what is left")
    parser.add_argument("--report", action="store_true", help="only rebuild results/trained/ from finished jobs")
    args = parser.parse_args(argv)
    todo = [j for j in jobs() if j.name.startswith(args.only)]
    if not todo:
        print(f"error: no job name starts with {args.only!r}", file=sys.stderr)
        return 2
    _, left = status(args.root, todo)
    if args.status:
        return 0
    failed = 0
    if not args.report:
        start = time.time()
        for job in left:
            failed += not campaign.run_job(args.root, job.name, job.overrides, flat=f"task='{job.task}'")
        print(f"this piece: {len(left) - failed} of {len(left)} jobs finished in {time.time() - start:.0f} s")
    if any((args.root / j.name / "summary.json").is_file() for j in jobs()):
        report(args.root)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
