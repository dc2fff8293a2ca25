"""The virtual clock against the physical testbed, at a scale this machine's cores hold (issue 63).

Every run records its rounds on the virtual clock (``pipeline/virtual_clock.py``) beside the wall clock; on the
emulated testbed the clock keeps what the testbed imposes (1 / a device's CPU quota as its scale, the links' and
the uplink's token-bucket rates), so the two can be set side by side: the clock computes from CPU seconds and
bytes what the testbed makes the run wait for. This campaign runs the testbed where its quotas are real: two
clusters of three devices (``network=testbed``: speeds 0.25-1 GHz) trained one at a time
(``runtime.concurrent_cus=1``) with the fastest device at half a core (``testbed.fastest_cores=0.5``), so the
cluster's quotas (at most 1.5 cores) with its CU and the decoder host stay within the two cores.

Two plans per seed: DSSRA's (mostly S = 1 here) and PipeLine's (S = 3, m = 4: the pipeline's critical path and its
D2D hand-overs at work).

Usage: ``python results/virtual_clock_check.py ROOT [--seeds 0 1] [--rounds 16] [--steps 5] [--variants ...]``
(root on Linux, for the cgroups; nothing else should run beside it). A job whose run folder has ``summary.json`` is
skipped, so it resumes; each finished job's ``rounds.jsonl`` (gzip), ``summary.json`` and ``status.json`` are
copied to ``results/virtual_clock/records/s<seed>[_pipeline].*``, and ``python results/virtual_clock_tables.py``
writes the table from them.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "results" / "virtual_clock" / "records"
COMMON = (
    "testbed=emulated network=testbed model=transformer_small runtime.concurrent_cus=1 testbed.fastest_cores=0.5 "
    "federation.num_clusters=2 eval.max_examples=64 eval.every=100 checkpoint=false"
)


# the plans the clock is checked on: DSSRA's own (on this network mostly S = 1: the D2D links cost more than the
# compute they would spread) and PipeLine's (every device a uniform segment, m = 4: S = 3, the critical path and
# the D2D hand-overs at work)
VARIANTS = {"dssra": "", "pipeline": "method=pipeline"}


def job_name(seed: int, variant: str) -> str:
    return f"s{seed}" if variant == "dssra" else f"s{seed}_{variant}"


def job_overrides(seed: int, rounds: int, steps: int, variant: str = "dssra") -> str:
    budget = f"federation.num_rounds={rounds} federation.local_steps={steps} seed={seed} network.seed={seed}"
    return f"{COMMON} {budget} {VARIANTS[variant]}".strip()


def keep(root: Path, name: str, records: Path = RECORDS) -> None:
    """Copy a finished job's records into the repository (``campaign.keep_records``)."""
    campaign.keep_records(root / name, records, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="where the runs go (kept between invocations)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    root = args.root.resolve()
    entries = [
        (
            root,
            job_name(seed, variant),
            job_overrides(seed, args.rounds, args.steps, variant),
            functools.partial(keep, root, job_name(seed, variant)),
        )
        for variant in args.variants
        for seed in args.seeds
    ]
    return campaign.run_queue("virtual clock against the testbed", entries)


if __name__ == "__main__":
    raise SystemExit(main())
