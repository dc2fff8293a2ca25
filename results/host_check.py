"""Whether this host may go on with a part of the virtual-clock campaign (``results/virtual_paper.py``).

The translation part (``paper``, ``scale``) runs at one code version (``b5ee319``), whose clock kept the server's and
the CUs' own work (the decoder's head steps, plan and aggregation, the embedding, a round's set-up) at the host's own
seconds: its records compare only among hosts of one speed (``virtual_paper/records/other_host/README.md``). Before
a session queues its jobs:

    python results/host_check.py

measures the virtual clock's host speed as a run's server does (``measure_host_flops``: the part's model, its first
TEB, the workload's probe; the median of three readings) and reads the kept jobs' host speed back from their devices
(``reportlib/host_speed.py``; jobs whose devices disagree, most of those that shared the machine, are left out; one
that shared it for its whole run reads low, which the median over the kept jobs outweighs). It prints both and exits
1 when they are two hosts (``host_speed.SAME_HOST``; the kept jobs that ran alone read 61-92e9 FLOP/s on the
campaign's host): then run the parts at the current code version, whose clock sets that work against
``clock.server_flops`` and ``clock.cu_flops``.

The probe is a matrix product; it does not see everything that sets a training step's speed. On 2026-11-30 it read
69-75e9 on a host (within 20% of the part's 79.1e9) whose jobs then ran 1.7x slower than the kept ones. So after a
session's first jobs of a translation part:

    python results/host_check.py --part paper --jobs ROOT/paper/j2/s3/dssra ROOT/paper/j2/s3/random

compares what that part's clock keeps at the host's own seconds, the decoder's term, with the kept jobs' of the same
methods, and exits 1 when they read another kind of host (:func:`check_jobs`).

That clock still reads about 10% apart between hosts 4x apart (docs/testbed.md), so a seed's methods, which the
claims pair, run on one host. For a task part (``--part classification`` or ``ner``) the check lists the seeds begun
but not finished, with their kept jobs' host speed (``virtual.host_flops``, written by the clock), and exits 1 when
this host is more than ``host_speed.SAME_SPEED`` from one of them: queue other seeds here. The tables leave a job
set against another speed than its seed's out of the claims whatever ran it (``virtual_paper_rows.mark_host_off``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from reportlib import host_speed  # noqa: E402
from reportlib.records import read_json, read_jsonl, read_jsonl_gz  # noqa: E402
from virtual_paper_rows import round_parts  # noqa: E402

from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.fl.server.server_state import Probe  # noqa: E402

READINGS = 3


def this_host_flops(overrides: list[str], readings: int = READINGS) -> float:
    """The median of ``readings`` host-speed readings, each as a run's server takes it at start-up."""
    cfg = load_run_config(overrides)
    probe = Probe.build(cfg)
    return statistics.median(probe.host_flops(cfg) for _ in range(readings))


def kept_speeds(part: str, records: Path = virtual_paper.RECORDS) -> dict[tuple[str, str], list[float]]:
    """The host speed of each kept job of ``part``, by (setting, seed) (``host_speed.job_host_flops``): written by
    the current clock, or read back from devices that agree on it (a job that shared the machine, or VanillaFL's,
    whose devices train as data users, is left out)."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in sorted((records / part).glob("*/*/*.rounds.jsonl.gz")):
        run = path.name.split(".")[0]
        overrides = read_json(path.with_name(f"{run}.status.json"))["overrides"]
        try:
            speed = host_speed.job_host_flops(read_jsonl_gz(path), overrides, str(path))
        except ValueError:
            continue
        out.setdefault((path.parts[-3], path.parts[-2]), []).append(speed)
    return out


def kept_host_flops(part: str, records: Path = virtual_paper.RECORDS) -> list[float]:
    """Every kept job's host speed of ``part`` (:func:`kept_speeds`), seeds together."""
    return [speed for speeds in kept_speeds(part, records).values() for speed in speeds]


def begun_seeds(part: str, records: Path = virtual_paper.RECORDS) -> dict[tuple[str, str], list[float]]:
    """The seeds of a task part with some but not all of its runs kept, and their jobs' host speeds: a session
    finishes such a seed only on a host of their speed (a seed's methods are paired, docs/testbed.md)."""
    speeds = kept_speeds(part, records)
    begun = {}
    for setting, seed in speeds:
        kept = list((records / part / setting / seed).glob("*.summary.json"))
        if len(kept) < len(virtual_paper.RUNS):
            begun[setting, seed] = speeds[setting, seed]
    return begun


def check_task_part(part: str, here: float, records: Path = virtual_paper.RECORDS) -> int:
    """For a part at the current clock: 1 when this host is off a begun seed's speed (:func:`begun_seeds`)."""
    begun = begun_seeds(part, records)
    if not begun:
        print(f"{part}: no seed begun and unfinished; this host ({here / 1e9:.1f}e9 FLOP/s) may start any seed")
        return 0
    refused = 0
    for (setting, seed), speeds in sorted(begun.items()):
        there = statistics.median(speeds)
        other = host_speed.off_speed(here, there)
        refused += other
        verdict = "begun on another host: finish it on one of its speed" if other else "may go on here"
        print(f"{part} {setting} {seed}: kept jobs {there / 1e9:.1f}e9 FLOP/s, this host {here / 1e9:.1f}e9; {verdict}")
    if refused:
        print(f"{refused} begun seed(s) of {part} ran on another host: queue other seeds here", file=sys.stderr)
    return int(refused > 0)


def decoder_terms(part: str, records: Path = virtual_paper.RECORDS) -> dict[str, list[float]]:
    """Each kept job's median decoder term (the slowest cluster's ``decoder_s``, ``round_parts``) of a translation
    part, by run (method), VanillaFL left out (its server trains no decoder)."""
    out: dict[str, list[float]] = {}
    for path in sorted((records / part).glob("*/*/*.rounds.jsonl.gz")):
        run = path.name.split(".")[0]
        if run != "vanilla_fl":
            out.setdefault(run, []).append(round_parts(read_jsonl_gz(path))["virtual_decoder_s"])
    return out


def check_jobs(part: str, job_dirs: list[Path], records: Path = virtual_paper.RECORDS) -> int:
    """1 when the given finished jobs (``ROOT/<part>/<setting>/<seed>/<run>/``) ran on another kind of host than the
    part's kept jobs, read from what the part's clock keeps at the host's own CPU seconds: the decoder's term. Each
    job's median decoder term over its method's median among the kept jobs; refused when the median of those ratios
    is more than ``host_speed.SAME_HOST`` from 1. The kept seeds' own medians lie within 0.92-1.15 (single jobs
    0.87-1.46: DSSRA's plans move its term); J = 2's seed 3 of 2026-11-30, on a host whose probe read 5-13% below the
    part's but whose training ran 1.7x slower, read 1.50-1.82, median 1.65 (``records/other_host/README.md``)."""
    kept = {run: statistics.median(terms) for run, terms in decoder_terms(part, records).items()}
    ratios = []
    for job in job_dirs:
        if job.name not in kept:
            print(f"{job}: no kept {part} job of method {job.name} to compare with; left out", file=sys.stderr)
            continue
        term = round_parts(read_jsonl(job / "rounds.jsonl"))["virtual_decoder_s"]
        ratios.append(term / kept[job.name])
        print(f"{job}: decoder term {term:.2f} s a round, kept {job.name} jobs' median {kept[job.name]:.2f} s")
    if not ratios:
        print("no job to compare: name finished run folders of the part's methods but VanillaFL", file=sys.stderr)
        return 2
    ratio = statistics.median(ratios)
    print(f"median ratio to the kept jobs: {ratio:.2f} over {len(ratios)} job(s)")
    if abs(ratio - 1.0) > host_speed.SAME_HOST:
        print(
            f"the jobs' decoder terms are {ratio:.2f}x the kept jobs': another kind of host for this workload; keep "
            f"them apart (records/other_host/) and add no more {part} jobs here",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="paper", choices=["paper", "scale", *virtual_paper.TASK_PARTS])
    parser.add_argument(
        "--jobs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="finished run folders of a translation part (ROOT/paper/j2/s3/dssra ...): check their decoder terms "
        "against the kept jobs' instead of this host's probe",
    )
    args = parser.parse_args(argv)
    if args.jobs:
        if args.part in virtual_paper.TASK_PARTS:
            parser.error("--jobs checks a translation part (paper, scale): the task parts' clock writes its speed")
        return check_jobs(args.part, args.jobs)
    if args.part in virtual_paper.TASK_PARTS:
        job = virtual_paper.task_jobs(args.part, [4], [0], ["dssra"])[0]
        return check_task_part(args.part, this_host_flops(job.overrides.split()))
    kept = kept_host_flops(args.part)
    if not kept:
        print(f"no kept job of part {args.part} reads its host's speed back: nothing to compare with", file=sys.stderr)
        return 2
    overrides = [*virtual_paper.COMMON.split(), "network.seed=0", "seed=0"]
    here, there = this_host_flops(overrides), statistics.median(kept)
    off = here / there - 1.0
    print(
        f"this host: {here / 1e9:.1f}e9 FLOP/s; the part's kept jobs: {there / 1e9:.1f}e9 (median of {len(kept)}, "
        f"{min(kept) / 1e9:.1f}-{max(kept) / 1e9:.1f}e9); {off:+.0%}"
    )
    if host_speed.two_hosts([here, there]):
        print(
            f"host speed off by more than {host_speed.SAME_HOST:.0%}: do not add jobs to the {args.part} part's "
            "code version here; run the parts at the current code version (clock.server_flops, clock.cu_flops)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
