"""Measured delay on the emulated heterogeneous testbed (testbed=emulated, docs/testbed.md): the paper's latency
claims on seconds a clock measured, not on eq. (26) alone.

Every job is one ``collapipe run`` (the Flower simulation, Ray device actors) on ``network=testbed`` with
transformer_small: each device actor under a cgroup CPU quota, each D2D hand-over and each CU's uplink through a
token bucket at the rate the system model gives. The CUs train one at a time (``runtime.concurrent_cus=1``) so
two clusters never share the two cores; a round's *measured delay* is then eq. (26)'s max over the selected
clusters of what each CU measured for its round (its local steps + its weight upload), as if each cluster had
its own hardware, which on a real deployment it has.

Parts (``--parts``; each job is skipped when its run folder already has ``summary.json``, so the campaign can
be run in pieces and rerun after an interruption; the tables are built from whatever has finished):

* ``methods``: DSSRA against the scheduling baselines (uniform, random, loss-only, delay-only) and the method
  baselines (w/o SS, PipeLine, VanillaFL, TITANIC), every one planning from measured profiles, per seed:
  measured seconds per round and, with ``--target-loss L``, to the first round whose training loss is at most L,
  beside eq. (26)'s modelled value. L is fixed by whoever starts the campaign, before any job runs; it is never
  read from the runs it judges (it once was: the largest final loss among a seed's runs, which every run reaches
  by construction, so the check could not fail). Without it the time to target is not computed;
* ``value``: the network configured with three equal devices while the testbed makes one of them 4x slower
  (``testbed.cpu_cores``, at each of the three positions); ``system.profile=config`` against ``measured``;
* the calibration table (modelled against measured per cluster and round) reads every finished job of
  ``methods`` that planned with DSSRA.

Usage: ``python results/testbed_delay.py ROOT [--parts methods value] [--seeds 0 1 2] [--target-loss L]
[--out results/testbed]``
(needs root on Linux for the cgroup quotas; about 80 s a job here). ``--report`` only rebuilds the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results/campaign.py, run as a script or loaded by path
import campaign  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import modelled as modelled_round  # noqa: E402
from reportlib.records import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COMMON = (
    "testbed=emulated network=testbed model=transformer_small runtime.concurrent_cus=1 "
    "eval.max_examples=64 eval.every=100 checkpoint=false"
)
SCHEDULERS = ("dssra", "uniform", "random", "loss_only", "delay_only")
METHODS = ("collapipe_no_ss", "pipeline", "vanilla_fl", "titanic")
SLOW_CORES = 0.25  # the secretly slow device of the value part: 4x below the others' 1.0 core


@dataclass(frozen=True)
class Job:
    part: str
    name: str
    overrides: str


def jobs(parts: list[str], seeds: list[int], rounds: int, steps: int) -> list[Job]:
    """Seed 0 of every part first, so a campaign cut short still has one of each."""
    budget = f"federation.num_rounds={rounds} federation.local_steps={steps}"
    out: list[Job] = []
    for seed in seeds:
        if "methods" in parts:
            for sched in SCHEDULERS:
                out.append(Job("methods", f"methods/s{seed}/{sched}", f"scheduler={sched} system.profile=measured"))
            for method in METHODS:
                out.append(Job("methods", f"methods/s{seed}/{method}", f"method={method} system.profile=measured"))
        if "value" in parts:
            for slow in range(3):
                cores = [1.0, 1.0, 1.0]
                cores[slow] = SLOW_CORES
                wrong = f"network.device.f_hz=[1.0e+9,1.0e+9] testbed.cpu_cores=[{','.join(map(str, cores))}]"
                for profile in ("config", "measured"):
                    out.append(Job("value", f"value/s{seed}/slow{slow}_{profile}", f"{wrong} system.profile={profile}"))
    return [
        Job(j.part, j.name, f"{COMMON} {budget} seed={j.name.split('/')[1][1:]} {j.overrides}")
        for j in out  # the seed is the job's folder s<seed>
    ]


def run_job(root: Path, job: Job) -> bool:
    return campaign.run_job(root, job.name, job.overrides)


# ----------------------------------------------------------------------------- reading a run
def _rounds(folder: Path) -> list[dict]:
    return [r for r in read_jsonl(folder / "rounds.jsonl") if r.get("round", 0) > 0 and "modelled" in r]


def cluster_rows(folder: Path) -> list[dict]:
    """Per (round, selected cluster that replied): eq. (26)'s terms and what the CU measured for them."""
    out = []
    for r in _rounds(folder):
        plan = modelled_round(r)
        assert plan is not None  # _rounds keeps rounds with a modelled section
        for n, mod in enumerate(plan.clusters):
            cu = r["clients"].get(str(n))
            if cu is None or not mod.delay_s:
                continue
            wait = cu.get("seconds-uplink-wait", 0.0)
            out.append(
                {
                    "round": r["round"],
                    "cluster": n,
                    "modelled_pipeline_s": mod.pipeline_s,
                    "modelled_uplink_s": mod.uplink_s,
                    "modelled_overhead_s": mod.overhead_s,
                    # the GPipe step without the head exchange: forward (embedding included) + backward + update
                    "measured_pipeline_s": cu["seconds-step-forward"]
                    + cu["seconds-step-backward"]
                    + cu["seconds-step-update"]
                    - cu["seconds-step-embed"],
                    "measured_uplink_s": wait + cu.get("seconds-upload", 0.0),
                    "measured_overhead_s": cu["seconds-step-head"] - wait + cu["seconds-step-embed"],
                    "measured_s": cu["seconds-train"] + cu.get("seconds-upload", 0.0),
                }
            )
    return out


def round_series(folder: Path) -> tuple[list[float], list[float], list[float]]:
    """Per round: measured delay (max over its clusters), eq. (26)'s modelled delay, training loss."""
    rows = cluster_rows(folder)
    measured, delays, loss = [], [], []
    for r in _rounds(folder):
        mine = [x["measured_s"] for x in rows if x["round"] == r["round"]]
        if not mine or r.get("train_loss") is None:
            continue
        measured.append(max(mine))
        plan = modelled_round(r)
        assert plan is not None
        delays.append(plan.round_delay_s)
        loss.append(float(r["train_loss"]))
    return measured, delays, loss


def seconds_to(measured: list[float], loss: list[float], target: float) -> float:
    total = 0.0
    for sec, value in zip(measured, loss):
        total += sec
        if value <= target:
            return total
    return float("nan")


def _finished(root: Path, part: str) -> list[Path]:
    return sorted(p.parent for p in (root / part).glob("s*/*/summary.json"))


# ----------------------------------------------------------------------------- tables
def calibration(root: Path) -> dict[str, float]:
    """Modelled (eq. 26, and eq. 26 + the CU's measured overhead) against measured, per cluster and round; rounds
    after the first (the first plans from the preset, before any profile exists)."""
    rows = [
        x
        for folder in _finished(root, "methods")
        if folder.name in ("dssra", "uniform", "random", "loss_only", "delay_only")
        for x in cluster_rows(folder)
        if x["round"] > 1
    ]
    if not rows:
        return {}
    meas = np.array([x["measured_s"] for x in rows])
    eq26 = np.array([x["modelled_pipeline_s"] + x["modelled_uplink_s"] for x in rows])
    full = eq26 + np.array([x["modelled_overhead_s"] for x in rows])
    out = {"calibration_points": float(len(rows))}
    for name, model in (("eq26", eq26), ("eq26_plus_overhead", full)):
        rel = np.abs(model - meas) / meas
        out[f"{name}_median_rel_error"] = float(np.median(rel))
        out[f"{name}_p90_rel_error"] = float(np.percentile(rel, 90))
    for term in ("pipeline", "uplink", "overhead"):
        err = np.array([x[f"modelled_{term}_s"] - x[f"measured_{term}_s"] for x in rows])
        out[f"{term}_median_error_s"] = float(np.median(err))
        out[f"{term}_median_abs_error_s"] = float(np.median(np.abs(err)))
    return out


def methods_table(root: Path, target: float | None = None) -> list[dict]:
    """Per seed and run: measured and modelled seconds a round, and (with a fixed ``target`` loss) the measured
    seconds to it (NaN: not reached, or no target set)."""
    out = []
    for seed_dir in sorted((root / "methods").glob("s*")):
        runs = {f.name: round_series(f) for f in _finished(root, "methods") if f.parent == seed_dir}
        runs = {k: v for k, v in runs.items() if v[0]}
        if not runs:
            continue
        for name, (measured, modelled, loss) in runs.items():
            later = slice(1, None)  # round 1 plans from the preset (no profile yet) and starts the actors
            out.append(
                {
                    "seed": seed_dir.name,
                    "run": name,
                    "measured_s_per_round": statistics.mean(measured[later] or measured),
                    "modelled_s_per_round": statistics.mean(modelled[later] or modelled),
                    "measured_s_to_target": math.nan if target is None else seconds_to(measured, loss, target),
                    "target_loss": target,
                    "final_loss": loss[-1],
                }
            )
    return out


def value_table(root: Path) -> list[dict]:
    out = []
    for folder in _finished(root, "value"):
        measured, modelled, _ = round_series(folder)
        if not measured:
            continue
        slow, profile = folder.name.split("_")
        out.append(
            {
                "seed": folder.parent.name,
                "slow_device": int(slow[4:]),
                "profile": profile,
                "measured_s_per_round": statistics.mean(measured[1:] or measured),
                "modelled_s_per_round": statistics.mean(modelled[1:] or modelled),
            }
        )
    return out


def _mean_by(rows: list[dict], key: str, value: str) -> dict[str, tuple[float, float, int]]:
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row[value])
    return {
        k: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for k, v in sorted(groups.items())
    }


def report(root: Path, out: Path, target: float | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cal = calibration(root)
    methods = methods_table(root, target)
    value = value_table(root)
    summary: dict = {"calibration": cal, "methods": methods, "value": value}
    figures: dict[str, float] = dict(cal)
    per_round = _mean_by(methods, "run", "measured_s_per_round")
    modelled = _mean_by(methods, "run", "modelled_s_per_round")
    to_target = _mean_by([m for m in methods if np.isfinite(m["measured_s_to_target"])], "run", "measured_s_to_target")
    if "dssra" in per_round:
        base = per_round["dssra"][0]
        for name, (mean, _, _) in per_round.items():
            if name != "dssra":
                figures[f"measured_round_margin_vs_{name}"] = (mean - base) / mean
                mod_base, mod = modelled["dssra"][0], modelled[name][0]
                figures[f"modelled_round_margin_vs_{name}"] = (mod - mod_base) / mod
    pairs: dict[tuple[str, int], dict[str, float]] = {}
    for row in value:
        pairs.setdefault((row["seed"], row["slow_device"]), {})[row["profile"]] = row["measured_s_per_round"]
    speedups = [p["config"] / p["measured"] for p in pairs.values() if {"config", "measured"} <= set(p)]
    if speedups:
        figures["measured_profile_speedup_mean"] = statistics.mean(speedups)
        figures["measured_profile_speedup_min"] = min(speedups)
        figures["measured_profile_speedup_max"] = max(speedups)
    summary["figures"] = figures
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    lines = [
        "# Measured delay on the emulated testbed",
        "",
        "Runs: the campaign folder ROOT of `python results/testbed_delay.py ROOT`.",
        "",
    ]
    if per_round:
        lines += [
            *md.head("| run | seeds | measured s / round | modelled eq. (26) s / round | measured s to target loss |"),
        ]
        for name, (mean, sd, n) in per_round.items():
            tt = to_target.get(name)
            tt_text = f"{tt[0]:.1f} +- {tt[1]:.1f} ({tt[2]})" if tt else "not reached"
            tt_text = tt_text if target is not None else "no target set"
            lines.append(f"| {name} | {n} | {mean:.2f} +- {sd:.2f} | {modelled[name][0]:.2f} | {tt_text} |")
        lines.append("")
    if value:
        lines += md.head("| seed | slow device | profile | measured s / round | modelled s / round |")
        for row in sorted(value, key=lambda r: (r["seed"], r["slow_device"], r["profile"])):
            lines.append(
                f"| {row['seed']} | {row['slow_device']} | {row['profile']} | {row['measured_s_per_round']:.2f} | "
                f"{row['modelled_s_per_round']:.2f} |"
            )
        lines.append("")
    lines += ["```"] + [f"{k}: {v:.4g}" for k, v in figures.items()] + ["```", ""]
    (out / "summary.md").write_text("\n".join(lines))
    for key, value_ in figures.items():
        print(f"{key}: {value_:.4g}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="where the runs go (kept between invocations)")
    parser.add_argument("--parts", nargs="+", default=["methods", "value"], choices=["methods", "value"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "testbed")
    parser.add_argument("--report", action="store_true", help="only rebuild the tables from finished runs")
    parser.add_argument(
        "--target-loss", type=float, default=None, help="training loss to time the runs to, fixed before any job runs"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    failed = 0
    if not args.report:
        todo = jobs(args.parts, args.seeds, args.rounds, args.steps)
        done = [j for j in todo if (root / j.name / "summary.json").is_file()]
        print(f"testbed campaign: {len(done)} of {len(todo)} jobs done, {len(todo) - len(done)} left", flush=True)
        for job in todo:
            failed += not run_job(root, job)
    report(root, args.out, args.target_loss)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
