"""Figures: matplotlib on the headless Agg backend, saved at one resolution."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

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
