"""The measured campaign at the paper's setting on the emulated testbed (issue 44): N = 3 clusters of K = 6
devices, J = 4 channels (and J = 2 with ``--channels 2``), every method and the paper's random scheduling, per
seed; each job's records kept in the repository so that every table is generated from them.

Every job is one ``collapipe run`` (the Flower simulation, one Ray actor per device) with
``testbed=emulated network=testbed_paper`` (conf/network/testbed_paper.yaml: devices 4x apart in speed under
cgroup CPU quotas, about half of them unable to hold the encoder under their memory cgroup's limit, D2D links
and uplinks through token buckets at the modelled rates) and transformer_small at L = 6 TEBs
(``model.enc_layers=6``, the paper's encoder depth), Multi30K En-De, every method planning from measured
profiles (``system.profile=measured``). The CUs train one after another (``runtime.concurrent_cus=1``) so that
two clusters never share the two cores; ``results/testbed_paper_tables.py`` reads a round as the clusters'
parallel round (docs/testbed.md).

Runs per seed and J: ``dssra`` (CollaPipe), ``random`` (the paper's random scheduling: random CUs on random
channels), and the method baselines ``collapipe_no_ss``, ``pipeline``, ``vanilla_fl``, ``titanic`` (their
reading in docs/baselines.md), each under DSSRA's scheduling.

Usage: ``python results/testbed_paper.py ROOT [--channels 4 2] [--seeds 0 1 2] [--rounds 6] [--steps 5]``
(root on Linux for the cgroups; about 4 minutes a job here). A job whose run folder has ``summary.json`` is
skipped, so the campaign resumes after an interruption. Each finished job's ``rounds.jsonl`` (gzip),
``summary.json`` and ``status.json`` are copied to ``results/testbed_paper/records/j<J>/s<seed>/<run>.*``; the
tables are then rebuilt from the kept records (``python results/testbed_paper_tables.py``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "results" / "testbed_paper" / "records"
COMMON = (
    "testbed=emulated network=testbed_paper model=transformer_small model.enc_layers=6 runtime.concurrent_cus=1 "
    "system.profile=measured eval.max_examples=64 eval.every=100 checkpoint=false"
)
RUNS = {
    "dssra": "scheduler=dssra",
    "random": "scheduler=random",
    "collapipe_no_ss": "method=collapipe_no_ss",
    "pipeline": "method=pipeline",
    "vanilla_fl": "method=vanilla_fl",
    "titanic": "method=titanic",
}


@dataclass(frozen=True)
class Job:
    channels: int
    seed: int
    run: str
    overrides: str

    @property
    def name(self) -> str:
        return f"j{self.channels}/s{self.seed}/{self.run}"


def jobs(channels: list[int], seeds: list[int], runs: list[str], rounds: int, steps: int) -> list[Job]:
    """Seed by seed, every run of a seed before the next seed, so a campaign cut short has whole seeds."""
    budget = f"federation.num_rounds={rounds} federation.local_steps={steps}"
    return [
        Job(j, seed, run, f"{COMMON} {budget} network.num_channels={j} seed={seed} network.seed={seed} {RUNS[run]}")
        for j in channels
        for seed in seeds
        for run in runs
    ]


def keep(root: Path, job: Job, records: Path = RECORDS) -> Path:
    """Copy a finished job's records into the repository (``campaign.keep_records``): rounds.jsonl (gzip),
    summary.json, status.json."""
    return campaign.keep_records(root / job.name, records / f"j{job.channels}" / f"s{job.seed}", job.run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="where the runs go (kept between invocations)")
    parser.add_argument("--channels", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    todo = jobs(args.channels, args.seeds, args.runs, args.rounds, args.steps)
    entries = [(root, j.name, j.overrides, functools.partial(keep, root, j)) for j in todo]
    return campaign.run_queue("testbed campaign", entries)


if __name__ == "__main__":
    raise SystemExit(main())
