"""The paper's comparison on the virtual clock (issue 63): N = 3 clusters of K = 6 devices at J = 4 and J = 2
channels, the six methods of the paper, 3 seeds, to a quality target fixed here before any job runs; and beyond the
paper's scale, N = 10 and N = 30 clusters (K = 6, J = 4) for CollaPipe, TITANIC and random.

Every job is one ``collapipe run`` with ``clock=virtual`` (``pipeline/virtual_clock.py``: each device's measured
CPU seconds at its phi_k f_k, D2D and uplink from their bytes at the modelled rates; docs/testbed.md "The virtual
clock") on ``network=testbed_paper``, the network of the measured testbed campaign (``results/testbed_paper.py``:
devices 4x apart in speed, about half of them unable to hold the encoder, D2D ~70 Mbit/s, uplinks of 20-30 MHz),
so the two campaigns read the same setting on two clocks; transformer_small at L = 6 TEBs
(``model.enc_layers=6``, the paper's encoder depth), Multi30K En-De, the devices in the CU's process
(``runtime.backend=local``: nothing is emulated, so nothing needs a process of its own). The validation BLEU is
measured after every round on the same fixed subset (the first ``EVAL_EXAMPLES`` sentences of the validation
split), and a job's time to target is the virtual clock's sum over the rounds up to the first that reaches
``TARGET_BLEU`` (``results/virtual_paper_tables.py``); a job that never reaches it within its rounds is censored,
its time a lower bound.

Runs per seed and J: ``dssra`` (CollaPipe), ``random`` (the paper's random scheduling), and the method baselines
``collapipe_no_ss``, ``pipeline``, ``vanilla_fl``, ``titanic`` (docs/baselines.md), each under DSSRA's scheduling.

Usage: ``python results/virtual_paper.py ROOT [--part paper|scale] [--channels 4 2] [--seeds 0 1 2] [--runs ...]``.
A job whose run folder has ``summary.json``, or whose records are kept in the repository already, is skipped, so
the campaign resumes over several sessions and machines; each job prints its cost as it ends, and its
``rounds.jsonl`` (gzip), ``summary.json``, ``status.json`` and ``cost.json`` (wall seconds, peak memory of its
process tree here) are copied to ``results/virtual_paper/records/<part>/<job>.*``, to be committed as they come. A
record that a later code version supersedes is moved to ``records/superseded/`` with the reason in its README,
never deleted.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
import testbed_paper  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "results" / "virtual_paper" / "records"
# the quality target and the budget, fixed before any job ran. A pilot (dssra, J = 4, seed 0, 20 rounds, not kept)
# read BLEU 2.7 at round 9, 9.3 at 14, 11.6 at 15, 14.3 at 16, 10.5 at 17, 16.3 at 19: 12 is reached about half way
# through 30 rounds by CollaPipe, leaving a method twice as slow room to reach it, and is past the lr warm-up
# (150 steps = 15 rounds of 10 steps), so the target is not met before training starts
TARGET_BLEU = 12.0
EVAL_EXAMPLES = 256
ROUNDS = 30
LOCAL_STEPS = 10
COMMON = (
    "clock=virtual runtime.backend=local network=testbed_paper model=transformer_small model.enc_layers=6 "
    f"eval.every=1 eval.max_examples={EVAL_EXAMPLES} checkpoint=false "
    f"federation.num_rounds={ROUNDS} federation.local_steps={LOCAL_STEPS}"
)
RUNS = testbed_paper.RUNS  # the same six runs as the testbed campaign: CollaPipe, random and the four baselines
SCALE_RUNS = ("dssra", "titanic", "random")


@dataclass(frozen=True)
class Job:
    part: str
    name: str
    overrides: str


def paper_jobs(channels: list[int], seeds: list[int], runs: list[str]) -> list[Job]:
    """Seed by seed, every run of a seed before the next seed, so a campaign cut short has whole seeds."""
    return [
        Job(
            "paper",
            f"j{j}/s{seed}/{run}",
            f"{COMMON} federation.num_clusters=3 network.num_channels={j} seed={seed} network.seed={seed} {RUNS[run]}",
        )
        for j in channels
        for seed in seeds
        for run in runs
    ]


def scale_jobs(clusters: list[int], seeds: list[int]) -> list[Job]:
    """N clusters of K = 6 devices on J = 4 channels, CollaPipe, TITANIC and random."""
    return [
        Job(
            "scale",
            f"n{n}/s{seed}/{run}",
            f"{COMMON} federation.num_clusters={n} network.num_channels=4 seed={seed} network.seed={seed} {RUNS[run]}",
        )
        for n in clusters
        for seed in seeds
        for run in SCALE_RUNS
    ]


def keep(root: Path, job: Job, records: Path = RECORDS) -> Path:
    """Copy a finished job's records into the repository (``campaign.keep_records``)."""
    name = Path(job.name)
    return campaign.keep_records(root / job.part / job.name, records / job.part / name.parent, name.name)


def is_kept(job: Job, records: Path = RECORDS) -> bool:
    """Whether the job's records are in the repository already (a campaign resumed in a later session)."""
    name = Path(job.name)
    return (records / job.part / name.parent / f"{name.name}.summary.json").is_file()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="where the runs go (kept between invocations)")
    parser.add_argument("--part", choices=["paper", "scale"], default="paper")
    parser.add_argument("--channels", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--clusters", nargs="+", type=int, default=[10, 30])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.part == "paper":
        todo = paper_jobs(args.channels, args.seeds, args.runs)
    else:
        todo = scale_jobs(args.clusters, args.seeds)
    kept = [j for j in todo if is_kept(j)]
    if kept:  # a later session, another ROOT: what is kept in the repository is done
        print(f"{len(kept)} job(s) already kept in {RECORDS.relative_to(REPO)}: skipped", flush=True)
    entries = [(root / j.part, j.name, j.overrides, functools.partial(keep, root, j)) for j in todo if not is_kept(j)]
    return campaign.run_queue(f"virtual-clock campaign ({args.part})", entries)


if __name__ == "__main__":
    raise SystemExit(main())
