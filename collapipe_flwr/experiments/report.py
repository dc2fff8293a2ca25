"""``python -m collapipe_flwr.experiments.report DIR``: a multirun folder (or one run folder) ->
``DIR/report/results.md``, ``results.csv`` and PNG figures (paper Figs. 4, 6, 7-8, 9-10, 11, Table III).

Reading is in :mod:`runs`, the numbers in :mod:`aggregate` and :mod:`reductions` (pure), the drawing
in :mod:`figures`; this module only wires them and writes files.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from collapipe_flwr.errors import exit_on_user_error
from collapipe_flwr.experiments import aggregate, figures, reductions, tables
from collapipe_flwr.experiments.runs import REPORT_SUBDIR, RunData, load_runs, sweep_command

CSV_COLUMNS = (
    "run",
    "ok",
    "method",
    "scheduler",
    "V",
    "task",
    "model",
    "network",
    "federation",
    "rounds",
    "segment_scheduling",
    "S",
    "m",
    "delta_last",
    "metric",
    "final_metric",
    "final_train_loss",
    "min_train_loss",
    "delay_total_s",
    "delay_compute_s",
    "delay_d2d_s",
    "delay_uplink_s",
    "energy_device_j",
    "energy_cu_j",
    "energy_total_j",
    "measured_train_s",
    "measured_round_s",
    "virtual_round_s",
    "wall_s",
    "max_device_mem_mib",
    "error",
)
# the markdown table: the CSV's columns in the same order, less the run's setting and the finer figures
CSV_ONLY = frozenset(
    ("model", "network", "federation", "rounds", "segment_scheduling", "delta_last", "energy_device_j", "energy_cu_j")
    + ("measured_train_s", "wall_s", "error")
)
MD_COLUMNS = tuple(c for c in CSV_COLUMNS if c not in CSV_ONLY)
MD_HEADERS = {
    "final_metric": "final val metric",
    "final_train_loss": "final train loss",
    "min_train_loss": "min train loss",
    "delay_total_s": "delay sum (s)",
    "delay_compute_s": "compute (s)",
    "delay_d2d_s": "D2D (s)",
    "delay_uplink_s": "uplink (s)",
    "energy_total_j": "energy (J)",
    "measured_round_s": "measured (s)",
    "virtual_round_s": "virtual clock (s)",
    "max_device_mem_mib": "max device mem (MiB)",
}


def build_rows(runs: Sequence[RunData]) -> list[dict]:
    return [aggregate.run_row(r.name, r.labels, r.rounds, r.ok, r.error, r.wall_s, r.config) for r in runs]


def figure_inputs(runs: Sequence[RunData], rows: Sequence[Mapping]) -> list[dict]:
    keys = aggregate.distinguishing_labels([r.labels for r in runs])
    keys = [k for k in keys if k != "task"] or ["method"]  # the task is each panel's title
    return [
        {
            "legend": aggregate.legend(run.labels, keys) + ("" if run.ok else " (failed)"),
            "labels": run.labels,
            "series": aggregate.series(run.rounds),
            "shape": aggregate.plan_shape(run.rounds),
            "uniform": aggregate.is_uniform_partition(run.config, run.rounds),
            "ok": run.ok,
            "final_metric": row.get("final_metric"),
            "metric": row.get("metric"),
        }
        for run, row in zip(runs, rows)
    ]


def memory_table(rows: Sequence[Mapping]) -> list[dict]:
    """Table III: per-device memory per method (and task), over the runs that reported it."""
    groups: dict[tuple, list[Mapping]] = defaultdict(list)
    for row in rows:
        if row.get("max_device_mem_mib") is not None:
            groups[(row.get("task"), row.get("method"))].append(row)
    out = []
    for (task, method), group in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        peaks = [g["max_device_mem_mib"] for g in group]
        flags = {g.get("segment_scheduling") for g in group} - {None}
        out.append(
            {
                "task": task,
                "method": method,
                "runs": len(group),
                "max_device_mem_mib": max(peaks),
                "mean_of_run_max_mib": sum(peaks) / len(peaks),
                "S": "/".join(sorted({str(g["S"]) for g in group if g.get("S")})),
                "segment_scheduling": flags.pop() if len(flags) == 1 else ("mixed" if flags else None),
            }
        )
    return out


def render_markdown(
    source: Path, rows, comparison_rows, memory_rows, figure_files, notes, command: str | None = None
) -> str:
    ok = sum(1 for r in rows if r["ok"])
    parts = [
        "# CollaPipe experiment report\n",
        f"Source: `{source}`: {len(rows)} runs ({ok} finished, {len(rows) - ok} failed).\n",
        *([f"Sweep: `{command}`\n"] if command else []),
        "Report: `python -m collapipe_flwr.experiments.report " + str(source) + "`\n",
        "## Runs\n",
        tables.to_markdown(rows, MD_COLUMNS, MD_HEADERS),
        "\nDelays and energy are the paper's modelled figures (eqs. 10-16, 26), summed over rounds; the split "
        "compute / D2D / uplink is the bottleneck CU's each round, so the three add up to the delay sum. "
        "`measured (s)` is the wall-clock of the rounds on this machine. All columns are in `results.csv`.\n",
        "## Delay reduction against the paper\n",
        "reduction(A, B) = 1 - sum_t tau_A(t) / sum_t tau_B(t) over the rounds both completed "
        "(modelled round delay tau, eq. 26). `ours (on-device)` is the same reduction of the on-device part "
        "of tau only (compute + D2D of the bottleneck CU, without the uplink).\n\n",
        tables.to_markdown(
            comparison_rows,
            ("comparison", "context", "ours_pct", "ours_device_pct", "paper_pct", "paper_note", "runs_a", "runs_b"),
            {
                "ours_pct": "ours",
                "ours_device_pct": "ours (on-device)",
                "paper_pct": "paper",
                "paper_note": "note",
                "runs_a": "runs A",
                "runs_b": "runs B",
            },
            {"ours_pct": reductions.fmt_pct, "ours_device_pct": reductions.fmt_pct, "paper_pct": reductions.fmt_pct},
        ),
        "\n## Per-device memory (Table III)\n",
        tables.to_markdown(
            memory_rows,
            ("task", "method", "runs", "max_device_mem_mib", "mean_of_run_max_mib", "S", "segment_scheduling"),
            {
                "max_device_mem_mib": "max per-device peak (MiB)",
                "mean_of_run_max_mib": "mean of runs' max (MiB)",
                "S": "S used",
                "segment_scheduling": "segment scheduling",
            },
        )
        if memory_rows
        else "No run reported per-device memory.\n",
        "\n## Figures\n",
    ]
    parts += [f"![{name}]({name})\n" for name in figure_files]
    parts += [f"- {note}\n" for note in notes]
    failed = [r for r in rows if not r["ok"]]
    if failed:
        parts.append("\n## Failed runs\n")
        parts += [f"- `{r['run']}`: {r['error'] or 'unknown error'}\n" for r in failed]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def _delay_series(run) -> dict:
    """A run's round delays for the reductions: the total tau and its on-device part (compute + D2D)."""
    series = aggregate.series(run.rounds)
    device = [None if c is None or d is None else c + d for c, d in zip(series["compute"], series["d2d"])]
    return {"labels": run.labels, "delay": series["delay"], "device_delay": device, "ok": run.ok}


FIGURES = (
    ("fig6_train_loss.png", figures.train_loss),
    ("fig7_8_compute_time.png", figures.compute_time),
    ("fig4_delay_grid.png", figures.delay_grid),
    ("fig9_10_metric_grid.png", figures.metric_grid),
    ("fig11_total_delay.png", figures.total_delay),
)


def write_report(source: Path, out_dir: Path | None = None) -> Path:
    """Read every run under ``source`` and write results.md / results.csv / figures; returns the report folder."""
    source = Path(source).resolve()
    runs = load_runs(source)
    out = Path(out_dir) if out_dir else source / REPORT_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    rows = build_rows(runs)
    series_runs = [_delay_series(run) for run in runs]
    comparison_rows = reductions.compare_all(series_runs)
    inputs = figure_inputs(runs, rows)
    drawn, notes = [], []
    for name, draw in FIGURES:
        (out / name).unlink(missing_ok=True)  # a figure that is skipped now must not linger from before
        path, note = draw(inputs, out / name)
        if path is not None:
            drawn.append(name)
        else:
            notes.append(note)
    (out / "results.csv").write_text(tables.to_csv(rows, CSV_COLUMNS))
    (out / "results.md").write_text(
        render_markdown(source, rows, comparison_rows, memory_table(rows), drawn, notes, sweep_command(source))
    )
    return out


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collapipe_flwr.experiments.report", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("dir", type=Path, help="a Hydra multirun folder, a sweep job folder or a run folder")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: DIR/report)")
    args = parser.parse_args(argv)
    out = write_report(args.dir, args.out)
    print(f"report: {out / 'results.md'}")
    print(f"table: {out / 'results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
