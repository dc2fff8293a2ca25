"""The virtual clock's consistency between kept jobs of the campaign (``results/virtual_paper.py``), read from their
records (``virtual_paper_rows.read_jobs``): the same plan's virtual compute in two jobs of a seed
(:func:`same_plan_ratios`), the host-scale decision's statistic (:func:`host_scale_spread`), how much of a plan's
spread the round's host probe explains (:func:`probe_fit`), jobs run twice (:func:`run_twice`) and the server's
decoder term by m (:func:`decoder_by_m`). ``results/virtual_paper_tables.py`` renders them in the table's clock
sections.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from reportlib import host_speed  # noqa: E402
from virtual_paper_rows import KeptJob, quality_target, read_jobs, time_to_target  # noqa: E402


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
    """A CU-round's plan as compared between jobs: (cluster, S, m, delta_k, the data users' devices), each
    cluster's devices the same in every job of a setting. The users' devices (``user_devices``, VanillaFL read the
    paper's way: D users, each training the whole model on its 1/D share of the batch on its own device,
    ``fl/cu/data_parallel.py``) set apart work that delta_k alone does not: a VanillaFL plan whose delta_k puts
    the six blocks on one device, as a pipeline plan at S = 1 does, runs D smaller batches on D devices, not the
    whole batch on that one. A plan without them (every pipeline method's) keys as before."""
    users = tuple(int(d) for d in plan.get("user_devices") or ())
    return int(plan["cluster"]), int(plan["S"]), int(plan["m"]), tuple(plan.get("delta", ())), users


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
    (:func:`plan_compute` ``per_host``); the ratio of the host speeds their clocks were set against; and the ratio
    of their virtual seconds to the part's quality target (``time_to_target``; NaN unless both reached it), what the
    clock's spread does to the figure the claims judge. Where the clock's host scale does its work, the compute
    ratio is nearer 1 than the CPU seconds' ratio."""
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
        metric, target = quality_target(first.part)
        (t1, r1, _), (t2, r2, _) = (time_to_target(j.records, target, metric) for j in (first, again))
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
                "to_target": t2 / t1 if r1 is not None and r2 is not None else float("nan"),
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
