"""Tables of the virtual-clock campaign (``results/virtual_paper.py``) from its kept records
(``results/virtual_paper/records/``): writes ``results/virtual_paper/table.md`` and ``results/virtual_paper/runs.csv``.

Per job (one method, seed and J, or N for the scale part):

* **time to target**: the virtual clock's rounds (``virtual.round_s``: the slowest cluster + the server's part,
  set-up and profiling counted in their round) summed up to the first round whose validation metric on the fixed
  subset reaches the part's target (:func:`quality_target`: BLEU >= ``virtual_paper.TARGET_BLEU`` for translation,
  a task part's own metric and target otherwise); a job that never reaches it is censored, its figure the sum over
  all its rounds (a lower bound, marked ``>=``);
* **rounds to target**, the final BLEU, the job's wall time here and the peak memory of its process tree (summed
  PSS, ``cost.json``: ``results/campaign.py``);
* **the round by part** (the median over a job's rounds of the slowest cluster's parts): virtual compute, D2D,
  CU, uplink, decoder, set-up, and eq. (26)'s modelled compute, D2D and uplink of the modelled slowest cluster,
  so a reader sees which term decides;
* **selection** (the plan's ``selected`` CUs of each round): CUs selected a round (mean), how many of the N
  CUs were ever selected, and the largest share of rounds one CU was selected in (1.0: some CU every round);
* **C10 and the queue** (``reportlib/c10_queue.py``): per job, the plans' Gamma_n and Y_n against C10.

Jobs kept apart in ``records/other_host/`` (run on a host of another speed by a clock that kept the server's and
the CUs' own work at the host's seconds: ``reportlib/host_speed.py``) are not in the table's comparison; the table
lists them with their time to target as recorded and read at the configured server and CU speeds. runs.csv holds
them too (``apart`` "host"), and says per job which claims it enters (``claims``: :func:`claims_use`): a job kept
apart for its host, or set against another speed than its seed's, enters the final metric's rows only.
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from reportlib import c10_queue, host_speed  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from reportlib.records import modelled, read_json, read_jsonl_gz  # noqa: E402

RESULTS = Path(__file__).resolve().parent
RECORDS = RESULTS / "virtual_paper" / "records"
OTHER_HOST = RECORDS / "other_host"
OUT = RESULTS / "virtual_paper" / "table.md"
CSV = RESULTS / "virtual_paper" / "runs.csv"
VIRTUAL_PARTS = ("compute_s", "d2d_s", "cu_s", "uplink_s", "decoder_s", "setup_s")
MODELLED_PARTS = ("compute_s", "d2d_s", "uplink_s")
PART_COLUMNS = [("virtual", p) for p in VIRTUAL_PARTS] + [("modelled", p) for p in MODELLED_PARTS]


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


def job_row(path: Path, rules: dict[tuple[str, str], float]) -> dict:
    """One kept job's row of runs.csv from its records (``path``: its ``rounds.jsonl.gz``); ``rules`` caches
    Gamma^max by the docs' rule per part and setting (composed once)."""
    part, setting, seed = path.parts[-4], path.parts[-3], path.parts[-2]
    run = path.name.split(".")[0]
    records = read_jsonl_gz(path)
    seconds, reached, final = time_to_target(records, *reversed(quality_target(part)))
    rounds_s = [float((r.get("virtual") or {}).get("round_s") or 0.0) for r in records if r.get("round", 0) >= 1]
    summary = read_json(path.with_name(f"{run}.summary.json"))
    cost_file = path.with_name(f"{run}.cost.json")
    cost = read_json(cost_file) if cost_file.is_file() else {}
    overrides = read_json(path.with_name(f"{run}.status.json"))["overrides"]
    if (part, setting) not in rules:
        rules[(part, setting)] = c10_queue.rule_gamma_max(overrides)
    return {
        "part": part,
        "setting": setting,
        "seed": seed.lstrip("s"),
        "run": run,
        **_host_speed(records, overrides, str(path.relative_to(RESULTS))),
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


def job_rows(records_dir: Path = RECORDS) -> list[dict]:
    """The compared jobs' rows (every kept job but those superseded or kept apart for their host), each with its
    ``host_off`` (:func:`mark_host_off`), ``apart`` "" and ``claims`` (:func:`claims_use`)."""
    rules: dict[tuple[str, str], float] = {}
    rows = [
        job_row(path, rules)
        for path in sorted(records_dir.glob("*/*/*/*.rounds.jsonl.gz"))
        if "superseded" not in path.parts and "other_host" not in path.parts
    ]
    return [{**r, "apart": "", "claims": claims_use(r["host_off"], "")} for r in mark_host_off(rows)]


def apart_rows(records_dir: Path = OTHER_HOST) -> list[dict]:
    """runs.csv's rows of the jobs kept apart for their host (``records/other_host/``: ``apart`` "host"); the
    table lists them in a section of their own (:func:`other_host_rows`)."""
    rules: dict[tuple[str, str], float] = {}
    rows = [job_row(path, rules) for path in sorted(records_dir.glob("*/*/*/*.rounds.jsonl.gz"))]
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


def other_host_rows(records_dir: Path = OTHER_HOST) -> list[dict]:
    """Per job kept apart for its host: the host speed read back from its devices, its time to target and median
    decoder term as recorded and read at the configured speeds (``host_speed.records_at_reference``)."""
    rows = []
    for path in sorted(records_dir.glob("*/*/*/*.rounds.jsonl.gz")):
        part, setting, seed = path.parts[-4], path.parts[-3], path.parts[-2]
        run = path.name.split(".")[0]
        records = read_jsonl_gz(path)
        overrides = read_json(path.with_name(f"{run}.status.json"))["overrides"]
        metric, target = quality_target(part)
        try:
            read, host = host_speed.records_at_reference(records, overrides, str(path.relative_to(RESULTS)))
        except ValueError:  # VanillaFL's devices, or devices that disagree, read no host speed back: not re-read
            read, host = None, None
        recorded, reached, _ = time_to_target(records, target, metric)
        rows.append(
            {
                "job": f"{part} {setting} s{seed.lstrip('s')} {run}",
                "host_gflops": None if host is None else host / 1e9,
                "recorded": recorded,
                "at_speeds": None if read is None else time_to_target(read, target, metric)[0],
                "round": reached,
                "decoder": (
                    round_parts(records)["virtual_decoder_s"],
                    None if read is None else round_parts(read)["virtual_decoder_s"],
                ),
            }
        )
    return rows


def _other_host_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    server, cu = host_speed.reference_rates()
    out = [
        "",
        f"Kept apart, run on a host of another speed (`records/other_host/`; the server's and the CUs' own work read "
        f"at server_flops = {server:.3g} and cu_flops = {cu:.3g}, `reportlib/host_speed.py`):",
        "",
        *md.head(
            "| job | host GFLOP/s (read back) | virtual s to target, recorded | at the configured speeds | round "
            "| median decoder s, recorded | at the configured speeds |"
        ),
    ]
    for r in rows:
        mark = "" if r["round"] is not None else ">= "
        host = "-" if r["host_gflops"] is None else f"{r['host_gflops']:.1f}"
        at_speeds = "-" if r["at_speeds"] is None else f"{mark}{r['at_speeds']:.1f}"
        cells = (host, f"{mark}{r['recorded']:.1f}", at_speeds)
        decoder = tuple("-" if x is None else f"{x:.2f}" for x in r["decoder"])
        out.append(md.row((r["job"], *cells, r["round"] or "-", *decoder)))
    return out


def _host_cell(r: dict) -> str:
    cell = {"clock": f"{r['host_gflops']}", "devices": f"~{r['host_gflops']}"}.get(r["host_read"], "-")
    return f"{cell} (off)" if r["host_off"] == "yes" else cell


def _host_lines(rows: list[dict]) -> list[str]:
    """The jobs set against another host speed than their seed's (``mark_host_off``), which the claims' clock rows
    leave out."""
    off = [r for r in rows if r["host_off"] == "yes"]
    rule = (
        "host GFLOP/s: the speed the job's clock was set against (`reportlib/host_speed.py`), as the clock wrote it "
        "(the probe at start-up, or from `f306ec1` the median of a reading every round), or `~` read back from an "
        "old record's devices (wall seconds: low where the job "
        f"shared the machine; `-`: not readable). A job whose written speed is more than {host_speed.SAME_SPEED:.0%} "
        "from its seed's median was set against another speed than the seed's other methods (another host, or an "
        "outlier of the probe): its pairings are left out of the claims' clock rows until it is rerun (its final "
        "metric still counts: runs.csv's `claims`)"
    )
    if not off:
        return ["", f"{rule}; no such job."]
    names = ", ".join(f"{r['part']} {r['setting']} s{r['seed']} {r['run']} ({r['host_gflops']})" for r in off)
    return ["", f"{rule}: {names}."]


def _task_targets() -> str:
    """The task parts' targets for the table's first line (``not fixed yet`` before the part's pilot)."""
    out = []
    for part, task in virtual_paper.TASK_PARTS.items():
        target = ", not fixed yet" if task.target is None else f" >= {task.target}"
        out.append(f"; {part}, validation {task.metric.removeprefix('val_')}{target}")
    return "".join(out)


def _selection_lines(rows: list[dict]) -> list[str]:
    """The selection section: per job, CUs selected a round, CUs ever selected, the top CU's share of rounds."""
    chosen = [
        "",
        "Selection (the plans' selected CUs over the rounds):",
        "",
        *md.head(
            "| part | setting | seed | run | N | CUs selected a round | CUs ever selected | top CU's share of rounds |"
        ),
    ]
    for r in rows:
        chosen.append(
            md.row(
                (
                    r["part"],
                    r["setting"],
                    r["seed"],
                    r["run"],
                    r["num_clusters"],
                    r["selected_per_round"],
                    r["cus_ever_selected"],
                    r["top_cu_share"],
                )
            )
        )
    return chosen


def table(rows: list[dict], apart: list[dict] | None = None) -> str:
    head = [
        "# The paper's comparison on the virtual clock (generated by results/virtual_paper_tables.py)",
        "",
        f"Targets: translation (parts paper and scale), validation BLEU >= {virtual_paper.TARGET_BLEU} on the first "
        f"{virtual_paper.EVAL_EXAMPLES} validation sentences{_task_targets()}; evaluated after every round; "
        f"{virtual_paper.ROUNDS} rounds of "
        f"{virtual_paper.LOCAL_STEPS} local steps at most. Time to target: the virtual clock's rounds summed "
        "(`>=`: censored, the target not reached; the sum over every round is a lower bound).",
        "",
        *md.head(
            "| part | setting | seed | run | virtual s to target | round | final metric | wall s | peak MB | lost "
            "| host GFLOP/s |"
        ),
    ]
    body = []
    for r in rows:
        mark = "" if r["reached_round"] != "" else ">= "
        body.append(
            f"| {r['part']} | {r['setting']} | {r['seed']} | {r['run']} | {mark}{r['virtual_s_to_target']:.1f} | "
            f"{r['reached_round'] or '-'} | {r['final_metric']:.{2 if r['part'] in ('paper', 'scale') else 3}f} | "
            f"{r['wall_s']} | {r['peak_pss_mb']} | "
            f"{r['lost_devices']} | {_host_cell(r)} |"
        )
    body.extend(_host_lines(rows))
    split = [
        "",
        "The round by part (median over a job's rounds; virtual: the slowest cluster's, measured compute scaled, "
        "links from bytes; modelled: eq. (26)'s slowest cluster):",
        "",
        *md.head(md.row(("part", "setting", "seed", "run", *(f"{kind} {p}" for kind, p in PART_COLUMNS)))),
    ]
    for r in rows:
        cells = [f"{r[f'virtual_{p}']:.2f}" for p in VIRTUAL_PARTS] + [
            f"{r[f'modelled_{p}']:.2f}" for p in MODELLED_PARTS
        ]
        split.append(md.row((r["part"], r["setting"], r["seed"], r["run"], *cells)))
    chosen = _selection_lines(rows)
    if not rows:
        body = ["| (no records yet) | | | | | | | | | | |"]
    c10 = c10_queue.table_lines(rows)
    return "\n".join([*head, *body, *split, *chosen, *c10, *_other_host_lines(apart or [])]) + "\n"


def csv_text(rows: list[dict]) -> str:
    """runs.csv's text: a line per job (the compared jobs' rows, then those kept apart for their host)."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def main() -> None:
    rows = job_rows()
    md.write(OUT, table(rows, other_host_rows()))
    if rows:
        CSV.write_text(csv_text([*rows, *apart_rows()]), encoding="utf-8")
    print(f"wrote {OUT} ({len(rows)} jobs)")


if __name__ == "__main__":
    main()
