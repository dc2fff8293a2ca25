"""The learning figures: Fig. 6 per method (mean +- sd over seeds) and Figs. 9-10 over (S, m)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from reportlib import plots

from learning_sections.runs import METHODS

# One look per method, so that methods whose curves coincide (the gradient-exact peers) stay visible: CollaPipe
# drawn last, thick and solid, the others dashed / dotted with markers.
STYLE = {
    "collapipe": {"color": "C3", "linestyle": "-", "linewidth": 2.4, "zorder": 5},
    "collapipe_no_ss": {"color": "C0", "linestyle": "--", "marker": "o"},
    "titanic": {"color": "C2", "linestyle": ":", "marker": "s"},
    "pipeline": {"color": "C1", "linestyle": "-.", "marker": "^"},
    "vanilla_fl": {"color": "C4", "linestyle": "--", "marker": "x"},
}


def _band(ax, x, values: np.ndarray, method: str, label: str) -> None:
    """Mean over seeds with a +- sd band, in the method's look."""
    mean, sd = values.mean(axis=0), values.std(axis=0)
    style = dict(STYLE.get(method, {}))
    if "marker" in style:
        style["markevery"] = max(1, len(x) // 8)
    ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, mean - sd, mean + sd, color=style.get("color"), alpha=0.15)


def plot_methods(task: str, runs: list[dict], path: Path) -> None:
    """Training loss against rounds and against the modelled delay; the validation metric against rounds."""
    plt = plots.pyplot()
    fig, (ax_r, ax_t, ax_m) = plt.subplots(1, 3, figsize=(15, 4))
    for method in sorted(METHODS, key=lambda m: m == "collapipe"):  # CollaPipe drawn last, on top
        group = [r for r in runs if r["ok"] and r["method"] == method]
        if not group:
            continue
        n = min(len(r["loss"]) for r in group)
        losses = np.array([r["loss"][:n] for r in group], dtype=float)
        _band(ax_r, np.array(group[0]["round"][:n]), losses, method, f"{method} (n={len(group)})")
        delay = np.array([[np.nan if v is None else v for v in r["delay_cum"][:n]] for r in group]).mean(axis=0)
        ax_t.plot(delay, losses.mean(axis=0), **{k: v for k, v in STYLE.get(method, {}).items() if k != "marker"})
        scored = [[(t, v) for t, v in zip(r["round"], r["metric_series"]) if v is not None] for r in group]
        k = min(len(s) for s in scored)
        if k:
            values = np.array([[v for _, v in s[:k]] for s in scored], dtype=float)
            _band(ax_m, np.array([t for t, _ in scored[0][:k]]), values, method, method)
    metric = next((r["metric"] for r in runs if r.get("metric")), "metric")
    ax_r.set(xlabel="communication round t", ylabel="training loss (mean +- sd over seeds)", title=f"{task}: Fig. 6")
    ax_t.set(xlabel="modelled cumulative delay sum_t tau(t) (s, eq. 26)", ylabel="training loss", title="over time")
    ax_m.set(xlabel="communication round t", ylabel=f"validation {metric} (mean +- sd)", title="metric")
    ax_r.legend(fontsize=8)
    plots.save(fig, path)


def plot_grid(task: str, runs: list[dict], path: Path) -> None:
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in sorted((r for r in runs if r["ok"]), key=lambda r: (r["S"], r["m"])):
        ax.plot(r["round"], r["loss"], label=f"S={r['S']:.0f}, m={r['m']:.0f}: {r['metric']} {r['final_metric']:.3f}")
    ax.set(xlabel="communication round t", ylabel="training loss", title=f"{task}: Figs. 9-10 (seed 0)")
    ax.legend(fontsize=8)
    plots.save(fig, path)
