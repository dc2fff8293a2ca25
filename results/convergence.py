"""Rounds to convergence of the training loss: the paper's Fig. 6c claim, judged on the kept training campaign.

Section VI on Fig. 6c (BERT fine-tuned for 15-class classification): "The training process converges more
rapidly -- typically within 15 training rounds". The paper gives no definition of "converges"; this module uses the
common time-to-90%: a run has converged at the first round r whose training loss L_r has made ``FRACTION`` (90%) of
the run's whole drop, from round 1's loss L_1 to the mean of its last ``TAIL`` (5) rounds' losses L_end:

    r_90 = min { r : L_r <= L_1 - 0.9 (L_1 - L_end) }.

The check can fail: a loss that falls at a steady pace to the end of a 30-round run reaches 90% of its drop near
round 27. Rounds without a training loss (a round whose every CU failed) are skipped, not filled in.

The records: ``results/trained/jobs/<task>/methods/seed<s>/collapipe/rounds.jsonl`` (CollaPipe, the trained-budget
campaign; `results/trained_learning.py`). The verdict follows ``results/claims.py``'s one rule, read for a ceiling
("within 15 rounds"): *reproduced* when our mean meets the ceiling, or the paper's 15 lies within our 95% interval,
or our mean is within 25% of it; else *not reproduced* (a count of rounds has no sign to keep).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from reportlib.records import read_jsonl
from reportlib.stats import t_half_width
from reportlib.verdict import SIZE_TOLERANCE  # the one rule's: within 25% of the paper's figure is its size

RESULTS = Path(__file__).resolve().parent
FRACTION, TAIL = 0.9, 5
PAPER_ROUNDS = 15  # Section VI on Fig. 6c: "typically within 15 training rounds" (classification)
SEEDS = (0, 1, 2)


def rounds_to_converge(rounds: Sequence[int], losses: Sequence[float]) -> int:
    """r_90 (module docstring) of one run's per-round training losses, in round order."""
    if len(rounds) != len(losses) or len(losses) < TAIL + 1:
        raise ValueError(f"need more than {TAIL} rounds with a training loss, got {len(losses)}")
    first, end = losses[0], statistics.mean(losses[-TAIL:])
    threshold = first - FRACTION * (first - end)
    return next(r for r, loss in zip(rounds, losses, strict=True) if loss <= threshold)


def run_losses(path: Path) -> tuple[list[int], list[float]]:
    """The rounds that have a training loss, and their losses, from one run's rounds.jsonl."""
    rows = [r for r in read_jsonl(path) if r.get("train_loss") is not None]
    return [int(r["round"]) for r in rows], [float(r["train_loss"]) for r in rows]


def collapipe_rounds(task: str) -> list[int]:
    """r_90 of CollaPipe's run, seed by seed, from the trained campaign's kept records."""
    jobs = RESULTS / "trained" / "jobs" / task / "methods"
    return [rounds_to_converge(*run_losses(jobs / f"seed{s}" / "collapipe" / "rounds.jsonl")) for s in SEEDS]


def verdict(values: Sequence[float], ceiling: float = PAPER_ROUNDS) -> str:
    """The one rule, read for a ceiling (module docstring)."""
    mean = statistics.mean(values)
    half = t_half_width(values)
    if mean <= ceiling or mean - half <= ceiling <= mean + half:
        return "reproduced"
    return "reproduced" if abs(mean - ceiling) <= SIZE_TOLERANCE * ceiling else "not reproduced"


def cell(values: Sequence[float]) -> str:
    mean, half = statistics.mean(values), t_half_width(values)
    seeds = ", ".join(str(v) for v in values)
    return f"{mean:.1f} rounds [{mean - half:.1f}, {mean + half:.1f}] (seeds: {seeds})"
