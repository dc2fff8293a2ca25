"""Whether this host may go on with the translation part of the virtual-clock campaign (``results/virtual_paper.py``).

That part runs at one code version (``b5ee319``), whose clock kept the server's and the CUs' own work (the decoder's
head steps, plan and aggregation, the embedding, a round's set-up) at the host's own seconds: its records compare
only among hosts of one speed (``virtual_paper/records/other_host/README.md``). Before a session queues its jobs:

    python results/host_check.py

measures the virtual clock's host speed as a run's server does (``measure_host_flops``: the part's model, its first
TEB, the workload's probe; the median of three readings) and reads the kept jobs' host speed back from their devices
(``reportlib/host_speed.py``; jobs whose devices disagree, most of those that shared the machine, are left out; one
that shared it for its whole run reads low, which the median over the kept jobs outweighs). It prints
both and exits 1 when they differ by more than ``TOLERANCE``: then run the parts at the current code version, whose
clock sets that work against ``clock.server_flops`` and ``clock.cu_flops`` and reads alike on any host.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from reportlib import host_speed  # noqa: E402
from reportlib.records import read_json, read_jsonl_gz  # noqa: E402

from collapipe_flwr import wiring  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.fl.server.server_state import count_workload, measure_host_flops, sample_hidden  # noqa: E402

TOLERANCE = 0.20  # relative; the kept jobs that ran alone read 61-92e9 FLOP/s on the campaign's host
READINGS = 3


def this_host_flops(overrides: list[str], readings: int = READINGS) -> float:
    """The median of ``readings`` host-speed readings, each as a run's server takes it at start-up."""
    cfg = load_run_config(overrides)
    task = wiring.build_task(cfg)
    model = wiring.build_model(task, cfg)
    hidden, mask = sample_hidden(task, model, cfg)
    workload = count_workload(model, hidden, mask, cfg)
    return statistics.median(measure_host_flops(model, workload, hidden, mask, cfg) for _ in range(readings))


def kept_host_flops(part: str, records: Path = virtual_paper.RECORDS) -> list[float]:
    """The host speed of each kept job of ``part`` whose devices agree on it (``host_speed.check_spread``)."""
    out = []
    for path in sorted((records / part).glob("*/*/*.rounds.jsonl.gz")):
        run = path.name.split(".")[0]
        if run == "vanilla_fl":  # its devices train as data users, whose seconds read back another way
            continue
        overrides = read_json(path.with_name(f"{run}.status.json"))["overrides"]
        timed = [r for r in read_jsonl_gz(path) if (r.get("virtual") or {}).get("clusters")]
        try:
            out.append(host_speed.recovered_host_flops(timed, overrides, str(path)))
        except ValueError:  # it shared the machine, or its devices trained as data users (VanillaFL): not readable
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="paper", choices=["paper", "scale"])
    args = parser.parse_args(argv)
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
    if abs(off) > TOLERANCE:
        print(
            f"host speed off by more than {TOLERANCE:.0%}: do not add jobs to the {args.part} part's code version "
            "here; run the parts at the current code version (clock.server_flops, clock.cu_flops)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
