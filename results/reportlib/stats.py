"""Summaries over seeds, and how a table writes them."""

from __future__ import annotations

import statistics


def mean_sd(values: list[float]) -> tuple[float, float]:
    """(mean, sample sd) of ``values``; the sd of one value is 0.0, and no value gives (nan, nan)."""
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def plus_minus(values: list[float], digits: int = 2, unit: str = "") -> str:
    """``mean<unit> +- sd`` of ``values`` (:func:`mean_sd`) at ``digits`` decimals, e.g. ``12.34% +- 0.56``."""
    mean, sd = mean_sd(values)
    return f"{mean:.{digits}f}{unit} +- {sd:.{digits}f}"


def t_half_width(values: list[float] | tuple[float, ...]) -> float:
    """Half the 95% Student-t interval of the mean of ``values`` (n - 1 degrees of freedom); infinite for one."""
    import math

    from scipy import stats

    if len(values) < 2:
        return math.inf
    return float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / math.sqrt(len(values))
