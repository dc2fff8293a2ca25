"""The README's rule for a margin against the paper's: *match* = the paper's sign and within ``MATCH_PP``
percentage points of it, else a *miss* (by sign, or by its distance); and the paper's margins it judges."""

from __future__ import annotations

MATCH_PP = 10.0
BASELINE_NAMES = {"vanilla_fl": "VanillaFL", "titanic": "TITANIC", "pipeline": "PipeLine", "collapipe_no_ss": "w/o SS"}
# Section VI on Figs. 7-8: CollaPipe's computation delay below each baseline's (w/o SS: +22.45% latency without
# segment scheduling, i.e. 22.45 / 122.45 below it); Fig. 8 also gives VanillaFL 29.98% below PipeLine
PAPER = {"vanilla_fl": 15.09, "titanic": 18.94, "pipeline": 40.55, "collapipe_no_ss": 100 * 22.45 / 122.45}
PAPER_VANILLA_VS_PIPELINE = 29.98


def verdict(ours: float, paper: float) -> str:
    """match (distance) / miss (sign) / miss (+-distance), by the module's rule."""
    if (ours > 0) != (paper > 0):
        return "miss (sign)"
    gap = ours - paper
    return f"match ({abs(gap):.1f} pp)" if abs(gap) <= MATCH_PP else f"miss ({gap:+.0f} pp)"
