"""The one verdict rule of the claims table (issue 63: verdicts judge size, not sign alone), on paired gains.

Per seed s, the paired difference is CollaPipe's gain over a baseline in percent of the baseline:
``100 (base_s - ours_s) / base_s`` for a delay, ``100 (ours_s - base_s) / base_s`` for a quality metric
(:func:`paired`); a row gives its mean over the seeds and the 95% Student-t interval of that mean.

With the paper's figure P (a gain in percent) and our mean gain g with its 95% interval [lo, hi]:

* *reproduced*: g has P's sign, and P lies within [lo, hi], or g is within 25% of P (|g - P| <= 0.25 |P|), or P
  is an "at least" / "more than" and g >= P;
* *direction only*: g has P's sign, but its size is none of the above;
* *not reproduced*: otherwise (g has the other sign, or is 0);
* *pending (n of 3 seeds)*: fewer than :data:`MIN_SEEDS` paired seeds, so no verdict yet. Two seeds' interval is
  12.7 standard errors wide (Student-t, one degree of freedom) and holds almost any figure, so "the paper's figure
  lies within our interval" could not fail; a campaign part still running shows its rows this way;
* *pending (n of 5 seeds: the interval holds 0 and P)*: fewer than :data:`FULL_SEEDS` paired seeds, and an interval
  that holds both 0 and the paper's figure: the seeds settle neither the sign nor the size, so "the paper's figure
  lies within our interval" could not fail, and a verdict either way would be read off noise (issue 63: "3 seeds,
  and 5 where an interval spans zero"). An interval that spans 0 but excludes P still judges the size (P is
  outside it: not reproduced in size, whichever the sign); with 5 seeds the rule judges every interval.

A lower bound on the gain (the baseline censored: it never reached the target, so its time is a lower bound) is
judged as far as a bound can be (:meth:`Paired.bound_verdict`): *reproduced* when it meets an "at least", *direction
only* when it has P's sign (a bound does not pin a size, so never "within 25%"), else undecided ("-").

The sign comes first: an interval as wide as three noisy seeds give (-107% [-265, +51] against the paper's 15%)
holds the paper's figure, yet a mean of the other sign reproduces nothing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from reportlib import markdown as md
from reportlib.stats import t_half_width

SIZE_TOLERANCE = 0.25  # the verdict rule: our mean within 25% of the paper's figure, relative, is its size
MIN_SEEDS = 3  # the verdict rule: fewer paired seeds than this give no verdict ("pending"), whatever they read
FULL_SEEDS = 5  # ... and fewer than this give none while the interval holds both 0 and the paper's figure


@dataclass(frozen=True)
class PaperFigure:
    """A figure of the paper's, as a gain in percent: ``value`` and whether the claim is a floor (``at_least``: "at
    least 48.98%", "more than half"); ``text`` is how the table shows it."""

    value: float
    at_least: bool = False
    text: str = ""

    def cell(self) -> str:
        return self.text or f"{self.value:.2f}%"


@dataclass(frozen=True)
class Paired:
    """CollaPipe's per-seed gains over one baseline (percent of the baseline) and their summary."""

    gains: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.mean(self.gains)

    @property
    def half_width(self) -> float:
        """Half the 95% Student-t interval of the mean (n - 1 degrees of freedom)."""
        return t_half_width(self.gains)

    def verdict(self, paper: PaperFigure) -> str:
        """The verdict rule (module docstring) on this gain against the paper's figure."""
        if len(self.gains) < MIN_SEEDS:
            return self.pending()
        low, high = self.mean - self.half_width, self.mean + self.half_width
        if len(self.gains) < FULL_SEEDS and low <= 0 <= high and low <= paper.value <= high:
            return f"pending ({len(self.gains)} of {FULL_SEEDS} seeds: the interval holds 0 and P)"
        if self.mean * paper.value <= 0:
            return "not reproduced"
        within = math.isfinite(self.half_width) and low <= paper.value <= high  # one seed has no interval
        if within or abs(self.mean - paper.value) <= SIZE_TOLERANCE * abs(paper.value):
            return "reproduced"
        if paper.at_least and self.mean >= paper.value:
            return "reproduced"
        return "direction only"

    def bound_verdict(self, paper: PaperFigure) -> str:
        """The verdict rule (module docstring) on a lower bound of the gain: the mean of per-seed lower bounds."""
        if len(self.gains) < MIN_SEEDS:
            return self.pending()
        if paper.at_least and self.mean >= paper.value:
            return "reproduced"
        return "direction only" if self.mean * paper.value > 0 else "-"

    def pending(self) -> str:
        return f"pending ({len(self.gains)} of {MIN_SEEDS} seeds)"

    def cell(self) -> str:
        if not math.isfinite(self.half_width):
            return f"{self.mean:+.2f}% (one seed, no interval)"
        return f"{self.mean:+.2f}% [{self.mean - self.half_width:+.2f}, {self.mean + self.half_width:+.2f}]"


def by_method(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """A campaign's rows with a ``method`` column: its ``run``, CollaPipe's (the ``dssra`` run) named ``collapipe``,
    the name :func:`paired` reads."""
    return [{**r, "method": "collapipe" if r["run"] == "dssra" else r["run"]} for r in rows]


def paired(rows: list[dict[str, str]], baseline: str, column: str, lower_is_better: bool) -> Paired:
    """CollaPipe against ``baseline`` on ``column``, paired by seed (only seeds both have)."""
    ours = {r["seed"]: float(r[column]) for r in rows if r["method"] == "collapipe"}
    base = {r["seed"]: float(r[column]) for r in rows if r["method"] == baseline}
    seeds = sorted(set(ours) & set(base), key=int)
    if not seeds:
        raise ValueError(f"no seed has both collapipe and {baseline} in the records")
    sign = 1.0 if lower_is_better else -1.0
    return Paired(tuple(sign * 100.0 * (base[s] - ours[s]) / base[s] for s in seeds))


def row(claim: str, task: str, paper: PaperFigure, p: Paired, kind: str, source: str) -> str:
    """One line of the claims table: the claim, the paper's figure, ours with its interval, and the verdict."""
    return md.row((claim, task, paper.cell(), p.cell(), kind, source, p.verdict(paper)))
