"""Figures: matplotlib on the headless Agg backend, saved at one resolution."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

DPI = 120


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, after choosing the headless backend (no display here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, tight: bool = True) -> None:
    """Lay ``fig`` out (``tight``), write it to ``path`` and close it."""
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)


def label(ax: Any, xlabel: str, ylabel: str, title: str | None = None, **legend: Any) -> None:
    """Name ``ax``'s axes, title it when ``title`` is given, and draw its legend (``legend``: the legend's keyword
    arguments, e.g. ``fontsize``)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.legend(**legend)


def mean_curves(curves: dict[str, list], ylabel: str, title: str, path: Path) -> None:
    """One line a name of ``curves`` (one series a seed, a value a round): the mean over its seeds against the round
    t = 1, 2, ...; labelled, saved to ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, series in curves.items():
        mean = np.mean(series, axis=0)
        ax.plot(range(1, len(mean) + 1), mean, label=name)
    label(ax, "communication round t", ylabel, title)
    save(fig, path)
