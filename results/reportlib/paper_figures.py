"""The paper's headline figures that the claims table judges, each as a gain in percent (:class:`PaperFigure`)."""

from __future__ import annotations

from reportlib.verdict import PaperFigure

# Section VI (Figs. 7-8): CollaPipe's accumulated computation delay below each baseline's, in percent; w/o SS's
# "+22.45% latency" is 22.45 / 122.45 = 18.33% below it
PAPER_COMPUTE = {"titanic": 18.94, "vanilla_fl": 15.09, "pipeline": 40.55, "collapipe_no_ss": 100 * 22.45 / 122.45}
PAPER_LATENCY = 48.98  # abstract: "reduces end-to-end latency by at least 48.98%"
PAPER_QUALITY = 2.76  # contribution 4: "improvements of up to 2.76% in inference accuracy"
PAPER_RANDOM = 7.12  # Section VI on Fig. 11: DSSRA's latency 7.12% below random scheduling's
BASELINES = ("titanic", "vanilla_fl", "pipeline", "collapipe_no_ss")


def latency_floor() -> PaperFigure:
    return PaperFigure(PAPER_LATENCY, at_least=True, text=f"at least {PAPER_LATENCY:.2f}%")


def compute_figure(baseline: str) -> PaperFigure:
    return PaperFigure(PAPER_COMPUTE[baseline])


def quality_figure() -> PaperFigure:
    return PaperFigure(PAPER_QUALITY, text=f"up to {PAPER_QUALITY:.2f}%")


def random_figure() -> PaperFigure:
    return PaperFigure(PAPER_RANDOM, text=f"{PAPER_RANDOM:.2f}% (Fig. 11)")


def delay_figure(baseline: str) -> PaperFigure:
    """The figure a time or round delay against ``baseline`` is judged on: Fig. 11's for random, else the floor."""
    return random_figure() if baseline == "random" else latency_floor()
