"""runs.csv's rows of the virtual-clock campaign (``results/virtual_paper.py``): one per kept job, read once from
its records in ``results/virtual_paper/records/`` (``results/virtual_paper_tables.py`` writes them and the table).

Per job: its time to target on the virtual clock (:func:`time_to_target`, the part's metric and target:
:func:`quality_target`), rounds to target, the final metric, wall time and peak memory, devices lost, the round by
part (:func:`round_parts`), selection (:func:`selection`), C10 and the queue (``reportlib/c10_queue.py``), the host
speed its clock was set against and whether it is off its seed's (:func:`mark_host_off`), and which claims' rows it
enters (:func:`claims_use`).
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

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


def selected_cu_rounds(job: KeptJob):
    """(round's virtual section, plan, virtual figures) of each selected CU-round of the job's trained rounds: the
    plan's cluster entry and the clock's per-cluster section for it."""
    for record in job.records:
        virtual = record.get("virtual") or {}
        for plan in (record.get("plan") or {}).get("clusters", []):
            cu = (virtual.get("clusters") or {}).get(str(plan["cluster"]))
            if record.get("round", 0) >= 1 and plan.get("selected") and cu is not None:
                yield virtual, plan, cu


def plan_key(plan: dict) -> tuple:
    """A CU-round's plan as compared between jobs: (cluster, S, m, delta_k), each cluster's devices the same in
    every job of a setting."""
    return int(plan["cluster"]), int(plan["S"]), int(plan["m"]), tuple(plan.get("delta", ()))


def head_on_server(job: KeptJob) -> bool:
    """Whether the job's method trains against the server's head (``method.head_on_server`` of its
    ``conf/method/<name>.yaml``, the name its records carry); VanillaFL's head trains on the device instead."""
    names = {str(r["method"]) for r in job.records if r.get("method")}
    if len(names) != 1:
        raise ValueError(f"{job.where}: its rounds name {sorted(names) or 'no'} method; one is needed")
    conf = yaml.safe_load((virtual_paper.REPO / "conf" / "method" / f"{names.pop()}.yaml").read_text())
    return bool(conf.get("head_on_server", True))


def decoder_by_m(jobs: list[KeptJob]) -> dict[tuple[str, str, int], list[float]]:
    """The server's decoder term of every selected CU-round (the virtual clock's per-cluster ``decoder_s``: the
    server's measured work on that CU's micro-batches; up to ``ea71830`` each micro-batch a decoder call of its
    own), by part, setting and the round's planned m, of the jobs whose head is the server's (:func:`head_on_server`:
    VanillaFL's CU-rounds, whose server does no decoder work, would read 0). Eq. (26) has no server term, so DSSRA
    chooses m without this cost."""
    out: dict[tuple[str, str, int], list[float]] = {}
    for job in (j for j in jobs if head_on_server(j)):
        for _, plan, cu in selected_cu_rounds(job):
            out.setdefault((job.part, job.setting, int(plan["m"])), []).append(float(cu["decoder_s"]))
    return out


def plan_compute(job: KeptJob, per_host: bool = False) -> dict[tuple, list[float]]:
    """The virtual compute (``compute_s``) of the job's selected CU-rounds by the plan that made them
    (:func:`plan_key`); ``per_host``: over the host speed the round's clock set it against (``virtual.host_flops``;
    rounds without it left out), the devices' CPU seconds up to the plan's constant device scale."""
    out: dict[tuple, list[float]] = {}
    for virtual, plan, cu in selected_cu_rounds(job):
        if per_host and not virtual.get("host_flops"):
            continue
        value = float(cu["compute_s"]) / (float(virtual["host_flops"]) if per_host else 1.0)
        out.setdefault(plan_key(plan), []).append(value)
    return out


def median_ratios(first: dict[tuple, list[float]], second: dict[tuple, list[float]], least: int = 3) -> list[float]:
    """Per plan both ran in at least ``least`` CU-rounds, the first's median over the second's, sorted."""
    common = [k for k in first if len(first[k]) >= least and len(second.get(k, ())) >= least]
    return sorted(statistics.median(first[k]) / statistics.median(second[k]) for k in common)


def run_twice(records_dir: Path, least: int = 3) -> list[dict]:
    """Jobs run twice at one code version: each job kept in ``superseded/host_off/`` (left out for its host reading,
    then run again) beside the kept job that replaced it. Per pair: the trained rounds whose plans (every
    cluster's) are the same in both; over the plans both ran in at least ``least`` CU-rounds, the median ratio
    (the second run over the first) of the devices' virtual compute and of their CPU seconds
    (:func:`plan_compute` ``per_host``); and the ratio of the host speeds their clocks were set against. Where
    the clock's host scale does its work, the compute ratio is nearer 1 than the CPU seconds' ratio."""
    kept = {(j.part, j.setting, j.seed, j.run): j for j in read_jobs(records_dir)}
    rows = []
    for first in read_jobs(records_dir / "superseded" / "host_off"):
        again = kept.get((first.part, first.setting, first.seed, first.run))
        if again is None:
            continue
        plans = [{int(r["round"]): (r.get("plan") or {}).get("clusters") for r in j.records} for j in (first, again)]
        trained = [t for t in plans[0] if t >= 1 and t in plans[1]]
        compute = median_ratios(plan_compute(again), plan_compute(first), least)
        cpu = median_ratios(plan_compute(again, per_host=True), plan_compute(first, per_host=True), least)
        speeds = [host_speed.job_host_flops(j.records, j.overrides, j.where) for j in (first, again)]
        rows.append(
            {
                "part": first.part,
                "setting": first.setting,
                "seed": first.seed,
                "run": first.run,
                "same_plans": sum(plans[0][t] == plans[1][t] for t in trained),
                "rounds": len(trained),
                "plans": len(compute),
                "compute": statistics.median(compute) if compute else float("nan"),
                "cpu": statistics.median(cpu) if cpu else float("nan"),
                "host": speeds[1] / speeds[0],
            }
        )
    return rows


def same_plan_ratios(jobs: list[KeptJob], least: int = 3) -> list[dict]:
    """The clock's consistency between two jobs of one part, setting and seed: for every plan both ran in at least
    ``least`` CU-rounds (:func:`plan_compute`), the ratio of the first job's median virtual compute to the
    second's (``ratios``), and of their CPU seconds (``cpu_ratios``: ``per_host``, before the clock's host scale).
    The same plan on the same device profile should read the same in any job; a ratio away from 1 is what the
    clock adds (the host scale, the host's drift between the jobs, what else ran in the job beside that cluster)."""
    by_seed: dict[tuple[str, str, str], list[KeptJob]] = {}
    for job in jobs:
        by_seed.setdefault((job.part, job.setting, job.seed), []).append(job)
    rows = []
    for (part, setting, seed), group in sorted(by_seed.items()):
        cells = {job.run: plan_compute(job) for job in group}
        cpu = {job.run: plan_compute(job, per_host=True) for job in group}
        runs = sorted(cells)
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                ratios = median_ratios(cells[first], cells[second], least)
                if ratios:
                    cpu_ratios = median_ratios(cpu[first], cpu[second], least)
                    pair = {"part": part, "setting": setting, "seed": seed, "pair": (first, second)}
                    rows.append({**pair, "ratios": ratios, "cpu_ratios": cpu_ratios})
    return rows


def host_scale_spread(jobs: list[KeptJob], least: int = 3) -> list[dict]:
    """The host-scale decision's statistic, fixed in results/README.md ("The host-scale decision") before it was
    computed: over every pair of jobs of one part, setting and seed whose server read the host every round
    (``virtual.host_reading``) and whose head is the server's (:func:`head_on_server`), per plan both ran in at least
    ``least`` CU-rounds (:func:`same_plan_ratios`), log(first's median / second's) of (P) the devices' virtual
    compute, the clock's per-round probe, and of (C) their CPU seconds, which any one host speed per seed gives
    alike (a constant cancels in a ratio of two jobs of a seed); per pair the median over its plans. Per part and
    over every pair ("both"): the pairs and the root mean square of those medians under each scale (0: every pair
    reads alike); ``smaller``: the scale whose spread is smaller, "probe" or "constant"."""
    probed = [
        job
        for job in jobs
        if any((r.get("virtual") or {}).get("host_reading") for r in job.records) and head_on_server(job)
    ]
    logs: dict[str, list[tuple[float, float]]] = {}
    for pair in same_plan_ratios(probed, least):
        if not pair["cpu_ratios"]:
            continue
        point = tuple(statistics.median(math.log(r) for r in pair[k]) for k in ("ratios", "cpu_ratios"))
        for key in (pair["part"], "both"):
            logs.setdefault(key, []).append(point)  # type: ignore[arg-type]
    rows = []
    for part, points in sorted(logs.items(), key=lambda kv: (kv[0] == "both", kv[0])):
        probe, constant = (math.sqrt(statistics.fmean(p[i] ** 2 for p in points)) for i in (0, 1))
        rows.append(
            {
                "part": part,
                "pairs": len(points),
                "rms_probe": probe,
                "rms_constant": constant,
                "smaller": "probe" if probe < constant else "constant",
            }
        )
    return rows


def probe_fit(jobs: list[KeptJob], least: int = 5) -> list[dict]:
    """How much of the run-to-run spread of a plan's CPU seconds the round's host probe explains, per part: over
    every (job, plan) with at least ``least`` CU-rounds whose round read the host (``virtual.host_reading``,
    ``clock.probe_every_round``), x = log(reading) and y = log(compute_s / host_flops) (the devices' CPU seconds
    up to the plan's constant device scale), each centred on its (job, plan) mean. ``slope``: the pooled
    least-squares slope of y on x (-1: the CPU seconds follow the reading, a faster host reading as fewer; 0: the
    reading tells nothing of them); ``sd``: the standard deviation of y; ``sd_read``: of y + x, the CPU seconds
    set against each round's own reading instead of the clock's running median."""
    pooled: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        cells: dict[tuple, list[tuple[float, float]]] = {}
        for virtual, plan, cu in selected_cu_rounds(job):
            reading, speed = virtual.get("host_reading"), virtual.get("host_flops")
            if reading and speed and cu["compute_s"] > 0:
                cells.setdefault(plan_key(plan), []).append((math.log(reading), math.log(cu["compute_s"] / speed)))
        for points in cells.values():
            if len(points) >= least:
                mx, my = statistics.fmean(x for x, _ in points), statistics.fmean(y for _, y in points)
                pooled.setdefault(job.part, []).extend((x - mx, y - my) for x, y in points)
    rows = []
    for part, points in sorted(pooled.items()):
        xx = sum(x * x for x, _ in points)
        rows.append(
            {
                "part": part,
                "cu_rounds": len(points),
                "slope": sum(x * y for x, y in points) / xx if xx > 0 else float("nan"),
                "sd": statistics.pstdev(y for _, y in points),
                "sd_read": statistics.pstdev(x + y for x, y in points),
            }
        )
    return rows


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
