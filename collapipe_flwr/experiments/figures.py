"""PNG figures of a report (matplotlib, Agg canvas). Each function takes plain per-run data and a path, and
returns ``(path, "")`` when it drew the figure or ``(None, note)`` saying why it skipped it. The drawing
helpers (figure, round axis, atomic PNG save) are the run plots' own (collapipe_flwr/fl/records/run_plots.py).

``runs`` items are dicts: {legend: str, labels: {...}, series: aggregate.series(...), shape:
aggregate.plan_shape(...), uniform: bool, ok: bool, final_metric: float | None, metric: str | None}.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from collapipe_flwr.experiments.aggregate import cumulative
from collapipe_flwr.fl.records.run_plots import new_figure, round_axis, save_figure

REPORT_DPI = 120


def _by_task(runs: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for run in runs:
        groups[str(run["labels"].get("task") or "task")].append(run)
    return dict(sorted(groups.items()))


def _plot_lines(ax, runs, key: str, transform=None) -> int:
    drawn = 0
    for run in runs:
        s = run["series"]
        xs, ys = s["round"], s[key] if transform is None else transform(s[key])
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=run["legend"])
            drawn += 1
    if drawn:
        ax.legend(fontsize=7)
    round_axis(ax)
    return drawn


def train_loss(runs: Sequence[Mapping], path: Path) -> tuple[Path | None, str]:
    """Fig. 6: training loss per round, a line per run, a panel per task."""
    groups = _by_task(runs)
    if not any(any(v is not None for v in r["series"]["train_loss"]) for r in runs):
        return None, "Fig. 6 skipped: no run logged a training loss"
    fig, axes = new_figure(len(groups))
    for ax, (task, group) in zip(axes[:, 0], groups.items()):
        _plot_lines(ax, group, "train_loss")
        ax.set_title(f"training loss ({task})")
        ax.set_ylabel("train loss")
    return save_figure(fig, path, dpi=REPORT_DPI), ""


def compute_time(runs: Sequence[Mapping], path: Path) -> tuple[Path | None, str]:
    """Figs. 7-8: cumulative on-device computation time (modelled, bottleneck CU) and measured CU training time."""
    if not any(any(v is not None for v in r["series"]["compute"]) for r in runs):
        return None, "Figs. 7-8 skipped: no run logged a modelled computation delay"
    groups = _by_task(runs)
    fig, axes = new_figure(len(groups), 2)
    for row, (task, group) in zip(axes, groups.items()):
        _plot_lines(row[0], group, "compute", cumulative)
        row[0].set_title(f"modelled on-device computation, cumulative ({task})")
        row[0].set_ylabel("seconds (modelled)")
        _plot_lines(row[1], group, "measured_train_s", cumulative)
        row[1].set_title(f"measured CU training wall-clock, cumulative ({task})")
        row[1].set_ylabel("seconds (measured)")
    return save_figure(fig, path, dpi=REPORT_DPI), ""


def total_delay(runs: Sequence[Mapping], path: Path) -> tuple[Path | None, str]:
    """Fig. 11: cumulative modelled total delay sum_t tau(t) per scheduling policy."""
    if not any(any(v is not None for v in r["series"]["delay"]) for r in runs):
        return None, "Fig. 11 skipped: no run logged a modelled round delay"
    groups = _by_task(runs)
    fig, axes = new_figure(len(groups))
    for ax, (task, group) in zip(axes[:, 0], groups.items()):
        _plot_lines(ax, group, "delay", cumulative)
        ax.set_title(f"cumulative total delay ({task})")
        ax.set_ylabel("seconds (modelled)")
    return save_figure(fig, path, dpi=REPORT_DPI), ""


def grid_points(runs: Sequence[Mapping], value_key: str) -> dict[str, dict[tuple[int, int], float]]:
    """{task: {(S, m): mean value}} over runs with a plan shape; value_key 'mean_delay' or 'final_metric'."""
    acc: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        S, m = run["shape"].get("S"), run["shape"].get("m")
        if S is None or m is None:
            continue
        if value_key == "mean_delay":
            delays = [d for d in run["series"]["delay"] if d is not None]
            value = sum(delays) / len(delays) if delays else None
        else:
            value = run.get(value_key)
        if value is not None:
            acc[str(run["labels"].get("task") or "task")][(int(S), int(m))].append(float(value))
    return {task: {k: sum(v) / len(v) for k, v in points.items()} for task, points in sorted(acc.items())}


def _plot_grid(points_by_task: dict, path: Path, title: str, ylabel: str, skip_note: str) -> tuple[Path | None, str]:
    varied = {task: pts for task, pts in points_by_task.items() if len(pts) >= 2}
    if not varied:
        return None, skip_note
    fig, axes = new_figure(len(varied))
    for ax, (task, pts) in zip(axes[:, 0], varied.items()):
        for S in sorted({k[0] for k in pts}):
            ms = sorted(m for (s, m) in pts if s == S)
            ax.plot(ms, [pts[(S, m)] for m in ms], marker="o", label=f"S={S}")
        ax.set_xlabel("micro-batches m")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({task})")
        ax.legend(fontsize=7)
    return save_figure(fig, path, dpi=REPORT_DPI), ""


def delay_grid(runs: Sequence[Mapping], path: Path) -> tuple[Path | None, str]:
    """Fig. 4: mean modelled round delay over S x m, runs with a uniform partition only."""
    uniform = [r for r in runs if r.get("uniform")]
    return _plot_grid(
        grid_points(uniform, "mean_delay"),
        path,
        "round delay, uniform partition",
        "mean round delay (s, modelled)",
        "Fig. 4 skipped: fewer than two (S, m) settings among uniform-partition runs "
        "(sweep method=collapipe_no_ss with method.fixed_m and network.devices_per_cluster)",
    )


def metric_grid(runs: Sequence[Mapping], path: Path) -> tuple[Path | None, str]:
    """Figs. 9-10: final task metric over S x m."""
    metric = next((r["metric"] for r in runs if r.get("metric")), "metric")
    return _plot_grid(
        grid_points(runs, "final_metric"),
        path,
        f"final {metric}",
        metric,
        "Figs. 9-10 skipped: fewer than two (S, m) settings with a task metric",
    )
