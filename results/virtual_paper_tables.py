"""Tables of the virtual-clock campaign (``results/virtual_paper.py``) from its kept records
(``results/virtual_paper/records/``): writes ``results/virtual_paper/table.md`` and ``results/virtual_paper/runs.csv``.

Per job (one method, seed and J, or N for the scale part; the rows are read in ``results/virtual_paper_rows.py``):

* **time to target**: the virtual clock's rounds (``virtual.round_s``: the slowest cluster + the server's part,
  set-up and profiling counted in their round) summed up to the first round whose validation metric on the fixed
  subset reaches the part's target (``virtual_paper_rows.quality_target``: BLEU >= ``virtual_paper.TARGET_BLEU``
  for translation, a task part's own metric and target otherwise); a job that never reaches it is censored, its
  figure the sum over all its rounds (a lower bound, marked ``>=``);
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
them too (``apart`` "host"), and says per job which claims it enters (``claims``: ``virtual_paper_rows.claims_use``):
a job kept apart for its host, or set against another speed than its seed's, enters the final metric's rows only.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import virtual_paper  # noqa: E402
from clock_consistency import decoder_by_m, host_scale_spread, probe_fit, run_twice, same_plan_ratios  # noqa: E402
from reportlib import c10_queue, host_speed  # noqa: E402
from reportlib import markdown as md  # noqa: E402
from virtual_paper_rows import (  # noqa: E402
    MODELLED_PARTS,
    RECORDS,
    RESULTS,
    VIRTUAL_PARTS,
    KeptJob,
    apart_rows,
    job_rows,
    quality_target,
    read_jobs,
    round_parts,
    time_to_target,
)

OUT = RESULTS / "virtual_paper" / "table.md"
CSV = RESULTS / "virtual_paper" / "runs.csv"
PART_COLUMNS = [("virtual", p) for p in VIRTUAL_PARTS] + [("modelled", p) for p in MODELLED_PARTS]


def other_host_rows(jobs: list[KeptJob]) -> list[dict]:
    """Per job kept apart for their host (``read_jobs(RECORDS / "other_host")``): the host speed read back from its
    devices, its time to target and median decoder term as recorded and read at the configured speeds
    (``host_speed.records_at_reference``)."""
    rows = []
    for job in jobs:
        metric, target = quality_target(job.part)
        try:
            read, host = host_speed.records_at_reference(job.records, job.overrides, job.where)
        except ValueError:  # VanillaFL's devices, or devices that disagree, read no host speed back: not re-read
            read, host = None, None
        recorded, reached, _ = time_to_target(job.records, target, metric)
        rows.append(
            {
                "job": f"{job.part} {job.setting} s{job.seed} {job.run}",
                "host_gflops": None if host is None else host / 1e9,
                "recorded": recorded,
                "at_speeds": None if read is None else time_to_target(read, target, metric)[0],
                "round": reached,
                "decoder": (
                    round_parts(job.records)["virtual_decoder_s"],
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


def _section(intro: str, header: str, rows: Iterable[Iterable[object]]) -> list[str]:
    """A table section of the clock's own readings: a blank line, its ``intro``, its header and its rows."""
    return ["", intro, "", *md.head(header), *(md.row(cells) for cells in rows)]


def _decoder_lines(by_m: dict[tuple[str, str, int], list[float]]) -> list[str]:
    """The server's decoder term by the planned m (``clock_consistency.decoder_by_m``), against m = 1's."""

    def cells(part: str, setting: str, m: int, values: list[float]) -> tuple:
        ones = by_m.get((part, setting, 1))
        ratio = f"{statistics.median(values) / statistics.median(ones):.2f}" if ones else "-"
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        return part, setting, m, len(values), f"{statistics.median(values):.2f}", f"{p90:.2f}", ratio

    return _section(
        "The server's decoder term of a CU-round by the plan's m (the clock's per-cluster `decoder_s`, each "
        "micro-batch a decoder call of its own at these code versions; every selected CU-round of the jobs that "
        "enter the clock rows and train against the server's head, VanillaFL's left out; eq. (26) has no server "
        "term):",
        "| part | setting | m | CU-rounds | median decoder s | p90 | median / m = 1's |",
        (cells(*key, values) for key, values in sorted(by_m.items())),
    )


def _same_plan_lines(pairs: list[dict]) -> list[str]:
    """The clock's consistency between jobs (``clock_consistency.same_plan_ratios``)."""

    def cells(r: dict) -> tuple:
        ratios, cpu = r["ratios"], r["cpu_ratios"]
        spread = (f"{statistics.median(ratios):.3f}", f"{ratios[0]:.3f}-{ratios[-1]:.3f}")
        return (r["part"], r["setting"], r["seed"], " / ".join(r["pair"]), len(ratios), *spread,
                f"{statistics.median(cpu):.3f}" if cpu else "-")  # fmt: skip

    return _section(
        "The same plan in two jobs of a seed (cluster, S, m and delta_k alike, at least 3 CU-rounds in each; every "
        "compared job, those marked off their seed's host speed too): the first job's median virtual compute over "
        "the second's, per plan, and the same for their CPU seconds (the compute over the host speed the round's "
        "clock set it against; `-`: a record without it). The same plan on the same devices should read the same "
        "in any job; what is away from 1 the clock adds:",
        "| part | setting | seed | jobs | plans | median ratio | range | CPU s: median ratio |",
        map(cells, pairs),
    )


def _probe_lines(fits: list[dict]) -> list[str]:
    """What the round's host probe explains of a plan's CPU seconds (``clock_consistency.probe_fit``)."""
    return _section(
        "What the round's host probe explains of a plan's CPU seconds (the jobs whose server read the host every "
        "round and that enter the clock rows; per job and plan of at least 5 CU-rounds, log CPU seconds and log "
        "reading centred; slope -1: the CPU seconds follow the reading, 0: the reading tells nothing of them; "
        "spread: the standard deviation of log CPU seconds as the clock sets them, and set against each round's "
        "own reading instead):",
        "| part | CU-rounds | slope | spread | spread against the round's reading |",
        ((f["part"], f["cu_rounds"], f"{f['slope']:.2f}", f"{f['sd']:.3f}", f"{f['sd_read']:.3f}") for f in fits),
    )


def _scale_lines(spread: list[dict]) -> list[str]:
    """The host-scale decision's statistic (``clock_consistency.host_scale_spread``; fixed in results/README.md)."""
    return _section(
        "The host-scale decision (its statistic and rule fixed in results/README.md before it was computed): over "
        "every pair of jobs of a seed whose server read the host every round, VanillaFL's aside, per pair the median "
        "over the plans both ran (at least 3 CU-rounds each) of log(first / second); the root mean square of those "
        "medians, of the devices' virtual compute under the clock's per-round probe and of their CPU seconds, which "
        "one host speed per seed gives alike. The smaller spread over both parts sets the next code version's scale:",
        "| part | pairs | RMS log ratio: per-round probe | RMS log ratio: one speed per seed | smaller |",
        ((r["part"], r["pairs"], f"{r['rms_probe']:.3f}", f"{r['rms_constant']:.3f}", r["smaller"]) for r in spread),
    )


def _twice_lines(pairs: list[dict]) -> list[str]:
    """Jobs run twice at one code version (``clock_consistency.run_twice``)."""

    def cells(r: dict) -> tuple:
        ratios = ("-" if math.isnan(r[k]) else f"{r[k]:.3f}" for k in ("compute", "cpu", "host", "to_target"))
        return r["part"], r["setting"], r["seed"], r["run"], f"{r['same_plans']} of {r['rounds']}", r["plans"], *ratios

    return _section(
        "A job run twice (the first kept in `records/superseded/host_off/`, the second replacing it; the second over "
        "the first, per plan both ran in at least 3 CU-rounds, the median): the devices' virtual compute, their CPU "
        "seconds (the compute over the host speed the round's clock set it against), the host speed, and the virtual "
        "seconds to the part's target (`-`: one run did not reach it). The same plan should read the same virtual "
        "compute; the clock's host scale helps where the compute ratio is nearer 1 than the CPU seconds' ratio:",
        "| part | setting | seed | run | rounds with the same plan | plans | compute | CPU s | host speed | "
        "time to target |",
        map(cells, pairs),
    )


def table(
    rows: list[dict],
    apart: list[dict] | None = None,
    by_m: dict[tuple[str, str, int], list[float]] | None = None,
    pairs: list[dict] | None = None,
    fits: list[dict] | None = None,
    twice: list[dict] | None = None,
    spread: list[dict] | None = None,
) -> str:
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
    decoder = (_decoder_lines(by_m) if by_m else []) + (_same_plan_lines(pairs) if pairs else [])
    decoder += (_scale_lines(spread) if spread else []) + (_probe_lines(fits) if fits else [])
    decoder += _twice_lines(twice) if twice else []
    return "\n".join([*head, *body, *split, *decoder, *chosen, *c10, *_other_host_lines(apart or [])]) + "\n"


def csv_text(rows: list[dict]) -> str:
    """runs.csv's text: a line per job (the compared jobs' rows, then those kept apart for their host)."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def outputs(records: Path = RECORDS) -> tuple[str, str]:
    """table.md's and runs.csv's text from the kept records, each job read once (runs.csv "" before any)."""
    jobs, apart = read_jobs(records), read_jobs(records / "other_host")
    rows = job_rows(jobs)
    on_clock = {(r["part"], r["setting"], r["seed"], r["run"]) for r in rows if r["claims"] == "all"}
    clocked = [j for j in jobs if (j.part, j.setting, j.seed, j.run) in on_clock]
    pairs, spread = same_plan_ratios(jobs), host_scale_spread(jobs)
    text = table(
        rows, other_host_rows(apart), decoder_by_m(clocked), pairs, probe_fit(clocked), run_twice(records), spread
    )
    return text, csv_text([*rows, *apart_rows(apart)]) if rows else ""


def main() -> None:
    text, runs = outputs()
    md.write(OUT, text)
    if runs:
        CSV.write_text(runs, encoding="utf-8")
    print(f"wrote {OUT} and {CSV}")


if __name__ == "__main__":
    main()
