"""runs.csv's rows of the virtual-clock campaign (``results/virtual_paper.py``): one per kept job, read once from
its records in ``results/virtual_paper/records/`` (``results/virtual_paper_tables.py`` writes them and the table).

Per job: its time to target on the virtual clock (:func:`time_to_target`, the part's metric and target:
:func:`quality_target`), rounds to target, the final metric, wall time and peak memory, devices lost, the round by
part (:func:`round_parts`), selection (:func:`selection`), C10 and the queue (``reportlib/c10_queue.py``), the host
speed its clock was set against and whether it is off its seed's (:func:`mark_host_off`), and which claims' rows it
enters (:func:`claims_use`).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from reportlib import c10_queue, host_speed  # noqa: E402
from reportlib.records import modelled, read_json, read_jsonl_gz  # noqa: E402

RESULTS = Path(__file__).resolve().parent
RECORDS = RESULTS / "virtual_paper" / "records"
OTHER_HOST = RECORDS / "other_host"
VIRTUAL_PARTS = ("compute_s", "d2d_s", "cu_s", "uplink_s", "decoder_s", "setup_s")
MODELLED_PARTS = ("compute_s", "d2d_s", "uplink_s")


@dataclass(frozen=True)
class KeptJob:
    """One kept job's records, read once: ``path`` its rounds.jsonl.gz, its part, setting (``j4``, ``n10``), seed
    (``"0"``) and run (``dssra``), its rounds and the overrides it ran with (``status.json``)."""

    path: Path
    part: str
    setting: str
    seed: str
    run: str
    records: list[dict]
    overrides: list[str]

    @property
    def where(self) -> str:
        """The records' path as results/ names it (in full where it lies elsewhere), for error messages."""
        return str(self.path.relative_to(RESULTS) if self.path.is_relative_to(RESULTS) else self.path)


def quality_target(part: str) -> tuple[str, float]:
    """The rounds.jsonl metric a part is judged on and its target: BLEU for translation (parts ``paper`` and
    ``scale``), else the task part's own (``virtual_paper.TASK_PARTS``), fixed before its records count."""
    if part in virtual_paper.TASK_PARTS:
        task = virtual_paper.TASK_PARTS[part]
        if task.target is None:
            raise ValueError(f"records of part {part} but its target is not fixed: set it in virtual_paper.TASK_PARTS")
        return task.metric, task.target
    return "val_bleu", virtual_paper.TARGET_BLEU


def time_to_target(records: list[dict], target: float, metric: str = "val_bleu") -> tuple[float, int | None, float]:
    """(virtual seconds to the first round whose ``metric`` reaches ``target``, or over all rounds; that round or
    None; the last round's ``metric``)."""
    total, reached, at_target = 0.0, None, None
    final = float("nan")
    for record in sorted((r for r in records if r.get("round", 0) >= 1), key=lambda r: r["round"]):
        total += float((record.get("virtual") or {}).get("round_s") or 0.0)
        if metric in record:
            final = float(record[metric])
            if reached is None and final >= target:
                reached, at_target = int(record["round"]), total
    return (at_target if at_target is not None else total), reached, final


def lost_devices(records: list[dict]) -> int:
    """Devices lost mid-round over the run (each re-planned around; none expected: nothing limits memory here)."""
    return sum(len(m.get("lost-devices", [])) for r in records for m in (r.get("clients") or {}).values())


def round_parts(records: list[dict]) -> dict[str, float]:
    """Median over the rounds of the slowest cluster's virtual parts and of eq. (26)'s modelled slowest cluster."""
    virtual = {p: [] for p in VIRTUAL_PARTS}
    eq26: dict[str, list[float]] = {p: [] for p in MODELLED_PARTS}
    for record in records:
        v = record.get("virtual") or {}
        if v.get("clusters"):
            row = v["clusters"][str(v["slowest"])]
            for p in VIRTUAL_PARTS:
                virtual[p].append(float(row[p]))
        plan = modelled(record)
        rows = [c for c in (plan.clusters if plan else ()) if c.delay_s > 0]
        if rows:
            worst = max(rows, key=lambda c: c.delay_s)
            for p, value in zip(MODELLED_PARTS, (worst.compute_s, worst.d2d_s, worst.uplink_s)):
                eq26[p].append(value)
    out = {f"virtual_{p}": statistics.median(v) if v else float("nan") for p, v in virtual.items()}
    out.update({f"modelled_{p}": statistics.median(v) if v else float("nan") for p, v in eq26.items()})
    return out


def selection(records: list[dict]) -> dict[str, float | int]:
    """Which CUs the plans selected over the trained rounds (see the module docstring)."""
    picks = [
        [int(c["cluster"]) for c in (r.get("plan") or {}).get("clusters", []) if c.get("selected")]
        for r in records
        if r.get("round", 0) >= 1
    ]
    clusters = max((len((r.get("plan") or {}).get("clusters", [])) for r in records), default=0)
    counts = [sum(n in chosen for chosen in picks) for n in range(clusters)]
    return {
        "num_clusters": clusters,
        "selected_per_round": round(statistics.mean(len(c) for c in picks), 3) if picks else "",
        "cus_ever_selected": sum(c > 0 for c in counts),
        "top_cu_share": round(max(counts) / len(picks), 3) if picks and counts else "",
    }


def job_row(job: KeptJob, rules: dict[tuple[str, str], float]) -> dict:
    """One kept job's row of runs.csv from its records, read once (:func:`read_jobs`); ``rules`` caches
    Gamma^max by the docs' rule per part and setting (composed once)."""
    part, setting, records, overrides = job.part, job.setting, job.records, job.overrides
    seconds, reached, final = time_to_target(records, *reversed(quality_target(part)))
    rounds_s = [float((r.get("virtual") or {}).get("round_s") or 0.0) for r in records if r.get("round", 0) >= 1]
    summary = read_json(job.path.with_name(f"{job.run}.summary.json"))
    cost_file = job.path.with_name(f"{job.run}.cost.json")
    cost = read_json(cost_file) if cost_file.is_file() else {}
    if (part, setting) not in rules:
        rules[(part, setting)] = c10_queue.rule_gamma_max(overrides)
    return {
        "part": part,
        "setting": setting,
        "seed": job.seed,
        "run": job.run,
        **_host_speed(records, overrides, job.where),
        "virtual_s_to_target": round(seconds, 3),
        "reached_round": "" if reached is None else reached,
        "final_metric": round(final, 3),
        "virtual_round_median_s": round(statistics.median(rounds_s), 3) if rounds_s else "",
        "wall_s": cost.get("wall_s", summary.get("wall_s", "")),
        "peak_pss_mb": cost.get("peak_pss_mb", ""),
        "lost_devices": lost_devices(records),
        **selection(records),
        **c10_queue.c10_queue(records),
        "rule_gamma_max": rules[(part, setting)],
        **{k: round(v, 3) for k, v in round_parts(records).items()},
    }


def read_jobs(records_dir: Path) -> list[KeptJob]:
    """Every job kept under ``records_dir`` (``<part>/<setting>/<seed>/<run>.rounds.jsonl.gz``), read once, but
    those below it in ``superseded/`` or ``other_host/``."""
    jobs = []
    for path in sorted(records_dir.glob("*/*/*/*.rounds.jsonl.gz")):
        if {"superseded", "other_host"} & set(path.relative_to(records_dir).parts):
            continue
        run = path.name.split(".")[0]
        overrides = read_json(path.with_name(f"{run}.status.json"))["overrides"]
        part, setting, seed = path.parts[-4], path.parts[-3], path.parts[-2].lstrip("s")
        jobs.append(KeptJob(path, part, setting, seed, run, read_jsonl_gz(path), overrides))
    return jobs


def job_rows(jobs: list[KeptJob]) -> list[dict]:
    """The compared jobs' rows (``read_jobs(RECORDS)``: every kept job but those superseded or kept apart for their
    host), each with its ``host_off`` (:func:`mark_host_off`), ``apart`` "" and ``claims`` (:func:`claims_use`)."""
    rules: dict[tuple[str, str], float] = {}
    rows = [job_row(job, rules) for job in jobs]
    return [{**r, "apart": "", "claims": claims_use(r["host_off"], "")} for r in mark_host_off(rows)]


def apart_rows(jobs: list[KeptJob]) -> list[dict]:
    """runs.csv's rows of the jobs kept apart for their host (``records/other_host/``, :func:`read_jobs`):
    ``apart`` "host"; the table lists them in a section of their own (``virtual_paper_tables.other_host_rows``)."""
    rules: dict[tuple[str, str], float] = {}
    rows = [job_row(job, rules) for job in jobs]
    return [{**r, "host_off": "", "apart": "host", "claims": claims_use("", "host")} for r in rows]


def claims_use(host_off: str, apart: str) -> str:
    """Which of the claims' rows a job enters (runs.csv's ``claims``; the one rule, stated in results/README.md).

    ``all``: every row. ``quality``: the rows of the validation metric only (the final metric; ``virtual_claims``),
    for a job whose clock was set against another host speed than its seed's other methods (``host_off`` "yes") or
    that is kept apart for its host (``apart`` "host"). Its clock figures would pair two hosts' speeds, but its
    training does not depend on the host: plans come from the configured profiles (``system.profile: config``), and
    a job's trajectory differs from a rerun's on another host only as much as two runs on one host differ
    (``virtual_paper/reruns.md``: a kept translation job run twice on another host, the same plans in every round,
    training losses within 0.21%; round 1: 9.6759 as kept, 9.6712 and 9.6738)."""
    return "quality" if host_off == "yes" or apart == "host" else "all"


def _host_speed(records: list[dict], overrides: list[str], where: str) -> dict[str, float | str]:
    """The job's host speed in GFLOP/s (``host_speed.job_host_flops``) and where it was read: ``clock`` (the clock
    measured it and wrote it), ``devices`` (read back from an old record's devices, whose compute
    seconds are wall seconds, so a job that shared the machine part of the time reads low), or "" where neither
    reads it (a job that shared the machine throughout, or VanillaFL's of an old record)."""
    try:
        speed = host_speed.job_host_flops(records, overrides, where)
    except ValueError:
        return {"host_gflops": "", "host_read": ""}
    source = "clock" if host_speed.clock_wrote_speed(records) else "devices"
    return {"host_gflops": round(speed / 1e9, 1), "host_read": source}


def mark_host_off(rows: list[dict]) -> list[dict]:
    """Each row's ``host_off``: "yes" where its clock-written host speed (``host_read`` "clock") is more than
    ``host_speed.SAME_SPEED`` from the median of its part, setting and seed's written speeds, "no" where it is
    within, "" where its clock wrote none. Its devices' compute was then set against another speed than its seed's
    other methods' (another host, which the clock's residual host dependence, about 10% between hosts 4x apart,
    docs/testbed.md, would enter as a gain; or an outlier of its probe), so the claims' clock rows
    (``virtual_claims.py``) leave its pairings out until it is rerun; its final metric still counts
    (:func:`claims_use`). Speeds read back from an old record's devices are wall seconds, lowered where the job
    shared the machine (61-92e9 FLOP/s among the translation part's jobs), so they do not count here; that part is
    kept to one kind of host as a whole (``host_check.py``, ``records/other_host/``)."""
    speeds: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r["host_read"] == "clock":
            speeds.setdefault((r["part"], r["setting"], r["seed"]), []).append(float(r["host_gflops"]))
    for r in rows:
        if r["host_read"] != "clock":
            r["host_off"] = ""
            continue
        median = statistics.median(speeds[r["part"], r["setting"], r["seed"]])
        r["host_off"] = "yes" if host_speed.off_speed(float(r["host_gflops"]), median) else "no"
    return rows
