"""Summaries over seeds."""

from __future__ import annotations

import statistics


def mean_sd(values: list[float]) -> tuple[float, float]:
    """(mean, sample sd) of ``values``; the sd of one value is 0.0, and no value gives (nan, nan)."""
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
