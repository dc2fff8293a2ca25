"""Delay reduction of method A against method B, beside the paper's headline figures.

    reduction(A, B) = 1 - sum_t tau_A(t) / sum_t tau_B(t)

with tau(t) the modelled round delay (eq. 26), summed over the rounds both sides completed (so a run
cut short is not rewarded). Several runs on one side (e.g. seeds) are averaged round by round.

Which runs are compared (only finished runs, within one task / model / network / federation context):
- methods (Section VI.C): A = ``method=collapipe`` (with ``scheduler=dssra`` when such runs exist),
  B = ``method=<baseline>``, restricted to A's schedulers when it has runs with them;
- scheduling policies (Fig. 11): A = ``method=collapipe scheduler=dssra`` (only its ``V=0.01`` runs
  when there are any: the paper's figures are for V = 0.01), B = ``method=collapipe scheduler=<policy>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONTEXT_KEYS = ("task", "model", "network", "federation")
PAPER_V = 0.01


@dataclass(frozen=True)
class Comparison:
    key: str  # the label that differs: "method" or "scheduler"
    a: str
    b: str
    paper_pct: float | None
    paper_note: str = ""


PAPER_COMPARISONS = (
    Comparison("method", "collapipe", "vanilla_fl", 15.09),
    Comparison("method", "collapipe", "titanic", 18.94),
    Comparison("method", "collapipe", "pipeline", 40.55),
    Comparison("method", "collapipe", "collapipe_no_ss", None, "paper: latency +22.45% without SS"),
    Comparison("scheduler", "dssra", "loss_only", 46.44),
    Comparison("scheduler", "dssra", "delay_only", 15.48),
    Comparison("scheduler", "dssra", "random", 7.12),
)


def delay_reduction(delays_a: Sequence[float | None], delays_b: Sequence[float | None]) -> float | None:
    """1 - sum(a) / sum(b) over the first min(len(a), len(b)) rounds; None when undefined."""
    n = min(len(delays_a), len(delays_b))
    if n == 0:
        return None
    a = [v for v in delays_a[:n] if v is not None]
    b = [v for v in delays_b[:n] if v is not None]
    if len(a) < n or len(b) < n:  # a round without a delay
        return None
    total_b = float(sum(b))
    if total_b <= 0:
        return None
    return 1.0 - float(sum(a)) / total_b


def mean_series(many: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Round-by-round mean of several runs' series, over the rounds all of them have."""
    if not many:
        return []
    n = min(len(s) for s in many)
    out: list[float | None] = []
    for t in range(n):
        values = [v for v in (s[t] for s in many) if v is not None]
        out.append(None if len(values) < len(many) else sum(values) / len(values))
    return out


def _context(labels: Mapping) -> tuple:
    return tuple(str(labels.get(k)) for k in CONTEXT_KEYS)


def _same_v(value, target: float) -> bool:
    try:
        return abs(float(value) - target) <= 1e-12 * max(1.0, abs(target))
    except (TypeError, ValueError):
        return False


def sides(comparison: Comparison, runs: Sequence[Mapping]) -> tuple[list[Mapping], list[Mapping]]:
    """The runs on side A and side B of a comparison (``runs``: dicts with labels, delay, ok)."""
    ok = [r for r in runs if r.get("ok")]
    if comparison.key == "method":
        a = [r for r in ok if r["labels"].get("method") == comparison.a]
        with_dssra = [r for r in a if r["labels"].get("scheduler") == "dssra"]
        a = with_dssra or a
        b = [r for r in ok if r["labels"].get("method") == comparison.b]
        schedulers = {r["labels"].get("scheduler") for r in a}
        b = [r for r in b if r["labels"].get("scheduler") in schedulers] or b  # like with like when possible
    else:
        pool = [r for r in ok if r["labels"].get("method") == "collapipe"]
        a = [r for r in pool if r["labels"].get("scheduler") == comparison.a]
        at_paper_v = [r for r in a if _same_v(r["labels"].get("V"), PAPER_V)]
        a = at_paper_v or a
        b = [r for r in pool if r["labels"].get("scheduler") == comparison.b]
    return a, b


def compare_all(runs: Sequence[Mapping], comparisons: Sequence[Comparison] = PAPER_COMPARISONS) -> list[dict]:
    """One row per (comparison, context): ours (percent or None), the paper's figure, how many runs each side.

    ``runs``: dicts {labels: {...}, delay: [tau(1), tau(2), ...], ok: bool}, optionally with
    ``device_delay``: the on-device part of each round's delay (compute + D2D of the bottleneck CU, i.e.
    tau without the uplink), which gives ``ours_device_pct``. A comparison with no run on one side still
    yields a row (ours None, printed "n/a") for every context that has runs.
    """
    contexts = sorted({_context(r["labels"]) for r in runs}) or [tuple("" for _ in CONTEXT_KEYS)]
    rows = []
    for comparison in comparisons:
        for context in contexts:
            in_context = [r for r in runs if _context(r["labels"]) == context]
            a, b = sides(comparison, in_context)
            value = device_value = None
            if a and b:
                value = delay_reduction(mean_series([r["delay"] for r in a]), mean_series([r["delay"] for r in b]))
                if all("device_delay" in r for r in a + b):
                    device_value = delay_reduction(
                        mean_series([r["device_delay"] for r in a]), mean_series([r["device_delay"] for r in b])
                    )
            rows.append(
                {
                    "comparison": f"{comparison.key}: {comparison.a} vs {comparison.b}",
                    "context": " ".join(f"{k}={v}" for k, v in zip(CONTEXT_KEYS, context)),
                    "ours_pct": None if value is None else 100.0 * value,
                    "ours_device_pct": None if device_value is None else 100.0 * device_value,
                    "paper_pct": comparison.paper_pct,
                    "paper_note": comparison.paper_note,
                    "runs_a": len(a),
                    "runs_b": len(b),
                }
            )
    return rows


def fmt_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"
