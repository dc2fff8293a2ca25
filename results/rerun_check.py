"""How far a kept job's training moves when the job is run again: writes ``results/virtual_paper/reruns.md`` from the
kept records (``results/virtual_paper/records/``) and their partial reruns (``records/reruns/``).

A rerun is the kept job's own overrides, at the kept job's code version, on whatever host a session had; its
``rounds.jsonl`` is kept gzipped as ``reruns/<part>/<setting>/<seed>/<run>.<label>.rounds.jsonl.gz`` (rounds
``1..n``; a rerun may be stopped early, its training being what is compared). Per round the table gives each run's
training loss and validation metric, and whether its plan (``plan``: S, m, delta_k, channels, power) is the kept
job's. Then the devices' virtual compute of the same plans (:func:`clock_lines`): the clock sets each call's CPU
seconds against the host speed it measured, so one plan on one device profile should read alike in a job and its
rerun, on any host; what a ratio shows beyond 1 is what the clock adds between two runs of one job.

What it settles (``virtual_paper_rows.claims_use``): whether a job's training, and so its final metric, depends
on the host it ran on, or only differs from run to run as two runs on one host do; and how far the clock's
compute moves between two runs of the same job.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clock_consistency import median_ratios, plan_compute  # noqa: E402
from reportlib import host_speed  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import read_json, read_jsonl_gz  # noqa: E402
from virtual_paper_rows import RECORDS, RESULTS, KeptJob, quality_target  # noqa: E402

RERUNS = RECORDS / "reruns"
OUT = RESULTS / "virtual_paper" / "reruns.md"
LEAST = 3  # CU-rounds of a plan in each run before its medians are compared (as ``same_plan_ratios``)


def by_round(records: list[dict]) -> dict[int, dict]:
    """The trained rounds (``round`` >= 1) by number."""
    return {int(r["round"]): r for r in records if r.get("round", 0) >= 1}


def same_plan(a: dict, b: dict) -> bool:
    """Whether two rounds' plans are the same decision (compared as canonical JSON)."""
    return json.dumps(a.get("plan"), sort_keys=True) == json.dumps(b.get("plan"), sort_keys=True)


def job_lines(kept_path: Path, reruns: list[Path]) -> list[str]:
    """One job's section: per round, the kept run's and each rerun's training loss and metric, and the plans."""
    part, setting, seed = kept_path.parts[-4], kept_path.parts[-3], kept_path.parts[-2]
    run = kept_path.name.split(".")[0]
    metric, _ = quality_target(part)
    kept_records, rerun_records = read_jsonl_gz(kept_path), runs_records(reruns)
    kept = by_round(kept_records)
    runs = {label: by_round(records) for label, records in rerun_records.items()}
    labels = sorted(runs)
    head = ["round", "kept: loss", f"kept: {metric}"]
    for label in labels:
        head += [f"{label}: loss", f"{label}: {metric}", f"{label}: the kept plan"]
    lines = ["", f"## {part} {setting} s{seed.lstrip('s')} {run}", "", *md.head(md.row(head))]
    last = max(max(r, default=0) for r in runs.values())
    for t in range(1, last + 1):
        cells: list[object] = [t, f"{kept[t]['train_loss']:.4f}", f"{kept[t][metric]:.3f}"]
        for label in labels:
            r = runs[label].get(t)
            if r is None:
                cells += ["-", "-", "-"]
            else:
                cells += [f"{r['train_loss']:.4f}", f"{r[metric]:.3f}", "yes" if same_plan(r, kept[t]) else "no"]
        lines.append(md.row(cells))
    overrides = read_json(kept_path.with_name(f"{run}.status.json"))["overrides"]
    return lines + clock_lines(kept_records, rerun_records, overrides, str(kept_path))


def runs_records(reruns: list[Path]) -> dict[str, list[dict]]:
    """Each rerun's records by its label (``<run>.<label>.rounds.jsonl.gz``)."""
    return {path.name.split(".")[1]: read_jsonl_gz(path) for path in reruns}


def clock_lines(kept: list[dict], reruns: dict[str, list[dict]], overrides: list[str], where: str) -> list[str]:
    """The devices' virtual compute of one plan in the rerun over the kept job's, per rerun: over the plans both ran
    in at least ``LEAST`` CU-rounds (``clock_consistency.plan_compute``: cluster, S, m, delta_k), the median and
    range of the ratio of their medians; and the host speed each run's clock was set against
    (``host_speed.job_host_flops``, GFLOP/s)."""
    head = ["rerun", "plans", "rerun / kept compute: median", "min", "max", "host GFLOP/s: kept", "rerun"]
    kept_cells = plan_compute(_job(kept))
    lines = ["", "The devices' virtual compute of the same plan:", "", *md.head(md.row(head))]
    for label, records in sorted(reruns.items()):
        ratios = median_ratios(plan_compute(_job(records)), kept_cells, LEAST)
        speeds = [_gflops(r, overrides, where) for r in (kept, records)]
        if not ratios:
            lines.append(md.row([label, 0, "-", "-", "-", *speeds]))
            continue
        median = statistics.median(ratios)
        lines.append(md.row([label, len(ratios), f"{median:.3f}", f"{ratios[0]:.3f}", f"{ratios[-1]:.3f}", *speeds]))
    return lines


def _job(records: list[dict]) -> KeptJob:
    """Records wrapped for ``plan_compute`` (which reads a job's records only)."""
    return KeptJob(Path(), "", "", "", "", records, [])


def _gflops(records: list[dict], overrides: list[str], where: str) -> str:
    try:
        return f"{host_speed.job_host_flops(records, overrides, where) / 1e9:.1f}"
    except ValueError:
        return "-"


def table(reruns_dir: Path = RERUNS, records_dir: Path = RECORDS) -> str:
    out = [
        "# Kept jobs run again (generated by results/rerun_check.py)",
        "",
        "Per round: the training loss and the validation metric of the kept job and of each rerun (the kept job's "
        "overrides and code version, another session's host), and whether the rerun's plan is the kept job's. Then "
        "the devices' virtual compute of each plan both ran in at least 3 CU-rounds, the rerun's median over the "
        "kept job's, and the host speed each run's clock was set against.",
    ]
    jobs: dict[Path, list[Path]] = {}
    for path in sorted(reruns_dir.glob("*/*/*/*.rounds.jsonl.gz")):
        part, setting, seed = path.parts[-4], path.parts[-3], path.parts[-2]
        run = path.name.split(".")[0]
        jobs.setdefault(records_dir / part / setting / seed / f"{run}.rounds.jsonl.gz", []).append(path)
    for kept_path, reruns in jobs.items():
        out += job_lines(kept_path, reruns)
    return "\n".join(out) + "\n"


def main() -> None:
    md.write(OUT, table())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
