"""The learning figures (Figs. 6, 9, 10) at budgets where the models learn, as a campaign that survives
interruptions.

    python results/trained_learning.py ROOT              # run every job not finished yet, in order
    python results/trained_learning.py ROOT --status     # only say what is done (with its time) and what is left
    python results/trained_learning.py ROOT --report     # only rebuild results/trained/ from the finished jobs
    python results/trained_learning.py ROOT --only translation/methods/seed0   # jobs whose name starts so
    python results/trained_learning.py ROOT --only ner --jobs 1              # the first NER job left, no more
    touch ROOT/STOP                                      # end the piece after the job that is running

Every job is one ``collapipe run`` (the Flower simulation path) into ``ROOT/<job name>/``. When it finishes, its
records (``config.json``, ``rounds.jsonl``, ``summary.json``: a few hundred KB, no weights) are copied into
``results/trained/jobs/<job name>/`` in the repository, and a job whose records are there is never run again: commit
that folder after a piece and the campaign goes on from a fresh clone on another machine (ROOT, with the models and
logs, may be lost in between). A job cut short is rerun from its start. After the jobs (or with ``--report``)
``results/fig6_learning.py`` rebuilds ``results/trained/`` (``learning.md``, ``grid.md``, ``runs.csv``, the
figures) from the records of whatever has finished, so the campaign can be run a few jobs at a time.

The budget is ``federation=long`` for every task (N = 2 clusters, 30 rounds of 25 local steps: about the central
translation recipe's sample budget; on NER it carries the central NER recipe, conf/recipe/ner_long.yaml), with
``runtime.backend=local`` (a cluster's devices in its CU's process: the learning does not depend on the backend,
and Ray actors cost start-up on 2 cores). Jobs, in the order they run, so that a campaign cut short still has
seed 0 of every task and method first:

- ``<task>/methods/seed<s>/<method>``: the five methods, seeds 0, 1, 2;
- ``<task>/repeat/seed0_collapipe``: CollaPipe at seed 0 again, the same-seed noise floor (only the order in
  which the server's decoder takes the CUs' steps differs) that each paper margin is judged against;
- ``<task>/central/seed0``, after seed 0 of the methods: the central recipe of docs/central_training.md (the plain
  model, no split, no federation, ``python -m collapipe_flwr.apps.train_central``) at a fixed step count, scored on the
  same whole validation split: the reference each method's final metric is set beside;
- ``<task>/grid/S<S>_m<m>``, translation and NER: Figs. 9-10, a uniform split over S devices with m fixed
  (``method=collapipe_no_ss network.devices_per_cluster=S method.fixed_m=m``), seed 0, compared on learning alone:
  ``federation.decoder_update=ordered`` (each step's CU updates applied in cluster order, per_cu's decoder step
  count kept) and ``runtime.seeded_dropout=true`` (masks from the seed, the same for any S).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "trained"
RECORDS = OUT / "jobs"  # the finished jobs' records, kept in the repository (module docstring)
STOP_FILE = "STOP"  # ROOT/STOP: the piece ends before its next job (the file is removed)
# what python -m collapipe_flwr.apps.train_central --json writes: a central job's record
CENTRAL_RECORD = "central.json"
# A job's marker last (its presence means "done"): summary.json for a run, central.json for a central job.
RECORD_FILES = ("config.json", "rounds.jsonl", "summary.json", CENTRAL_RECORD)
TASKS = ("translation", "classification", "ner")
METHODS = ("collapipe", "collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
SEEDS = (0, 1, 2)
GRID = ((1, 1), (1, 4), (2, 2), (3, 1), (3, 4))  # (S, m): the corners and S = m = 2 (Fig. 9's optimum)
GRID_TASKS = ("translation", "ner")
BUDGET = "federation=long runtime.backend=local checkpoint=false"
# The grid compares settings on learning alone: the CUs' steps reach the decoder in cluster order and every dropout
# mask follows the seed, so what differs between two points is what (S, m) changes, not thread timing.
LEARNING_ALONE = "federation.decoder_update=ordered runtime.seeded_dropout=true"
# The central recipes of docs/central_training.md, at the step counts they reached there in their time budget (a
# fixed count, so the reference does not shrink on a busy machine; --minutes only bounds a runaway job).
CENTRAL = {
    "translation": "model.optimizer.lr=0.002 model.lr_schedule.warmup_steps=150 model.lr_schedule.min_factor=0.05 "
    "--max-steps 1571",
    "ner": "task.batch_size=32 task.max_len=128 task.extra_train_files=[chinese_ner/supplementary_msra/msra_bio.txt] "
    "model.optimizer.lr=0.0007 model.lr_schedule.warmup_steps=100 model.lr_schedule.min_factor=0.05 "
    "model.dropout=0.2 --max-steps 1608",
    "classification": "--max-steps 1500",
}


@dataclass(frozen=True)
class Job:
    name: str  # ROOT/<name> is its run folder
    task: str
    overrides: str  # Hydra overrides of collapipe run; for a central job, train_central's arguments
    central: bool = False

    @property
    def marker(self) -> str:
        """The record whose presence means the job finished."""
        return CENTRAL_RECORD if self.central else "summary.json"


def jobs() -> list[Job]:
    """Every job of the campaign, in the order it runs (module docstring)."""
    out = [
        Job(f"{task}/methods/seed{seed}/{method}", task, f"{BUDGET} method={method} seed={seed}")
        for seed in SEEDS
        for task in TASKS
        for method in METHODS
    ]
    central = [Job(f"{task}/central/seed0", task, CENTRAL[task], central=True) for task in TASKS]
    out[len(TASKS) * len(METHODS) : len(TASKS) * len(METHODS)] = central  # after seed 0 of every method
    for task in TASKS:  # translation's first: it ran before the others had a repeat job
        out.append(Job(f"{task}/repeat/seed0_collapipe", task, f"{BUDGET} method=collapipe seed=0"))
    for task in GRID_TASKS:
        for s, m in GRID:
            grid = f"method=collapipe_no_ss network.devices_per_cluster={s} method.fixed_m={m} seed=0 {LEARNING_ALONE}"
            out.append(Job(f"{task}/grid/S{s}_m{m}", task, f"{BUDGET} {grid}"))
    return out


def keep_records(run_folder: Path, records: Path) -> None:
    """Copy a finished run's records into ``records`` (summary.json last, through a temporary name, so a copy cut
    short never reads as a finished job)."""
    records.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        source = run_folder / name
        if source.is_file():
            shutil.copyfile(source, records / (name + ".part"))
            (records / (name + ".part")).replace(records / name)


def finished(root: Path, job: Job, records: Path) -> bool:
    """True when the job's records are kept; a run folder under ROOT that finished but whose records were not kept
    yet (a piece stopped between the two) has them copied now."""
    if (records / job.name / job.marker).is_file():
        return True
    if (root / job.name / job.marker).is_file():
        keep_records(root / job.name, records / job.name)
        return True
    return False


def seconds_taken(records: Path) -> float | None:
    """The finished job's wall-clock seconds (summary.json's wall_s, a central job's total_seconds), None when it
    has not finished."""
    for name, key in (("summary.json", "wall_s"), (CENTRAL_RECORD, "total_seconds")):
        if (records / name).is_file():
            return float(json.loads((records / name).read_text()).get(key) or 0.0)
    return None


def run_central(root: Path, job: Job) -> bool:
    """``python -m collapipe_flwr.apps.train_central task=<task> <recipe> --json ROOT/<name>/central.json``; its output
    goes to ``ROOT/<name with / as _>.log``. True when it finished."""
    folder = root / job.name
    folder.mkdir(parents=True, exist_ok=True)
    args = [a for a in job.overrides.split(" ") if a]
    cmd = [sys.executable, "-m", "collapipe_flwr.apps.train_central", f"task={job.task}", *args, "--minutes", "120"]
    cmd += ["--quiet", "--json", str(folder / (CENTRAL_RECORD + ".part"))]
    start = time.time()
    with open(root / (job.name.replace("/", "_") + ".log"), "w") as log:
        rc = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if rc == 0:
        (folder / (CENTRAL_RECORD + ".part")).replace(folder / CENTRAL_RECORD)
    print(f"job {job.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - start:.0f} s", flush=True)
    return rc == 0


def status(root: Path, todo: list[Job], records: Path) -> tuple[list[Job], list[Job]]:
    """(done, left), printed with each finished job's seconds and the total so far."""
    done = [j for j in todo if finished(root, j, records)]
    left = [j for j in todo if j not in done]
    spent = 0.0
    for job in done:
        took = seconds_taken(records / job.name) or 0.0
        spent += took
        print(f"done  {job.name} ({took:.0f} s)")
    for job in left:
        print(f"left  {job.name}")
    print(f"{len(done)} of {len(todo)} jobs done ({spent / 3600:.1f} h of runs), {len(left)} left", flush=True)
    return done, left


def report(records: Path) -> int:
    """Rebuild results/trained/ from the kept records with results/fig6_learning.py (its figures printed)."""
    import fig6_learning

    source = "the campaign's kept records, results/trained/jobs/ (`python results/trained_learning.py ROOT`)"
    fig6_learning.main([str(records), "--out", str(OUT), "--source", source])
    return 0


def run_piece(root: Path, left: list[Job], records: Path) -> int:
    """Run the jobs left, in order, keeping each finished one's records; stop early at ROOT/STOP. Returns how many
    failed."""
    failed = ran = 0
    start = time.time()
    for job in left:
        if (root / STOP_FILE).is_file():
            (root / STOP_FILE).unlink()
            print(f"{root / STOP_FILE} found: stopping before {job.name}", flush=True)
            break
        if job.central:
            ok = run_central(root, job)
        else:
            ok = campaign.run_job(root, job.name, job.overrides, flat=f"task='{job.task}'")
        if ok:
            keep_records(root / job.name, records / job.name)
        failed += not ok
        ran += 1
    print(f"this piece: {ran - failed} of {len(left)} jobs finished in {time.time() - start:.0f} s")
    if ran and not failed:
        print(f"commit {records}/ to keep them across machines")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="folder of the campaign's runs (kept between pieces)")
    parser.add_argument("--only", default="", help="run only the jobs whose name starts with this")
    parser.add_argument(
        "--jobs", type=int, default=0, help="run at most this many of the jobs left in this piece (0: all of them)"
    )
    parser.add_argument("--status", action="store_true", help="only print what is done and what is left")
    parser.add_argument("--report", action="store_true", help="only rebuild results/trained/ from finished jobs")
    args = parser.parse_args(argv)
    todo = [j for j in jobs() if j.name.startswith(args.only)]
    if not todo:
        print(f"error: no job name starts with {args.only!r}", file=sys.stderr)
        return 2
    records = RECORDS  # read at call time, so a test can point it elsewhere
    _, left = status(args.root, todo, records)
    if args.status:
        return 0
    if args.jobs < 0:
        print(f"error: --jobs {args.jobs} must be >= 0 (0 runs every job left)", file=sys.stderr)
        return 2
    left = left[: args.jobs] if args.jobs else left
    failed = 0 if args.report else run_piece(args.root, left, records)
    if any((records / j.name / j.marker).is_file() for j in jobs()):
        report(records)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
