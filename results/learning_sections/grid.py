"""grid.md's sections: learning over (S, m) (Figs. 9-10) and the paper's (S, m) claims beside the grid."""

from __future__ import annotations

from reportlib import markdown as md
from reportlib.stats import mean_sd


def grid_section(task: str, runs: list[dict], figures: dict) -> list[str]:
    ok = sorted((r for r in runs if r["ok"]), key=lambda r: (r["S"] or 0, r["m"] or 0))
    if not ok:
        return []
    metric = next((r["metric"] for r in ok if r["metric"]), "metric")
    ref = ok[0]
    lines = [
        f"## {task}: learning over (S, m) (Figs. 9-10), uniform split, seed 0, metric = validation {metric}",
        "",
        *md.head(
            f"| S | m | final {metric} | final train loss | largest per-round |loss - loss at S={ref['S']:.0f}, "
            f"m={ref['m']:.0f}| | modelled delay (s) |"
        ),
    ]
    for r in ok:
        diff = max(abs(a - b) for a, b in zip(r["loss"], ref["loss"]) if a is not None and b is not None)
        lines.append(
            f"| {r['S']:.0f} | {r['m']:.0f} | {r['final_metric']:.4f} | {r['final_loss']:.4f} | {diff:.2e} | "
            f"{r['delay_s']:.1f} |"
        )
        figures[f"{task}_grid_S{r['S']:.0f}_m{r['m']:.0f}_{metric}"] = r["final_metric"]
        figures[f"{task}_grid_S{r['S']:.0f}_m{r['m']:.0f}_max_loss_diff"] = diff
    return lines + [""]


GRID_METHOD = "collapipe_no_ss"  # the grid's method (a uniform split, m fixed): its seed spread is the grid's noise
# The paper's (S, m) claims (Section VI.D): Fig. 9 on translation, Fig. 10 on NER; both are checked on every grid.
GRID_BEST = (2, 2)  # Fig. 9: "the optimal configuration ... S = 2 and m = 2, under which the best learning"
SMALL_M, LARGE_M = 1, 4  # Fig. 10: "reducing the value of m improves convergence", read at the grid's m = 1 and 4


def grid_claims_section(task: str, grid: list[dict], methods: list[dict], figures: dict) -> list[str]:
    """Figs. 9-10's claims beside the grid: whether (S, m) = (2, 2) learns best (Fig. 9) and whether m = 1 learns
    better than m = 4 at the same S (Fig. 10: higher final metric, lower mean training loss over rounds 1-10).

    The grid is one seed and repeatable to the bit (``ordered`` decoder updates, seeded dropout), so it has no
    spread of its own; each gap is set beside the seed-to-seed sd of the same method (:data:`GRID_METHOD`) in the
    methods runs, the spread a different seed would add: a gap within it is not shown by one seed."""
    points = {(round(r["S"]), round(r["m"])): r for r in grid if r["ok"] and r["S"] is not None and r["m"]}
    if not points:
        return []
    metric = next((r["metric"] for r in points.values() if r["metric"]), "metric")
    noise = _SeedNoise([r for r in methods if r["ok"] and r["method"] == GRID_METHOD], metric)
    lines = [
        f"### {task}: the paper's (S, m) claims beside the grid",
        "",
        *md.head("| figure | paper | ours (seed 0) | noise | verdict |"),
    ]
    lines += _best_point_row(task, points, metric, noise, figures)
    lines += _small_m_rows(task, points, metric, noise, figures)
    return lines + [""]


class _SeedNoise:
    """The seed-to-seed sd of the grid's method in the methods runs (``peers``): what a gap is judged against."""

    def __init__(self, peers: list[dict], metric: str):
        self.peers = peers
        self.sd_metric = (
            mean_sd([r["final_metric"] for r in peers if r["final_metric"] is not None])[1] if peers else None
        )
        self.sd_loss = mean_sd([r["early_loss"] for r in peers if r["early_loss"] is not None])[1] if peers else None
        self.text = (
            f"seed sd of {GRID_METHOD} (n={len(peers)}): {metric} {self.sd_metric:.3g}, early loss {self.sd_loss:.3g}"
            if len(peers) > 1
            else "no seed spread of the grid's method yet"
        )

    def judge(self, gap: float, sd: float | None) -> str:
        if sd is None or len(self.peers) < 2:
            return "no seed spread to judge it against"
        return "larger than the seed sd" if abs(gap) > sd else "within the seed sd"


def _best_point_row(task: str, points: dict, metric: str, noise: _SeedNoise, figures: dict) -> list[str]:
    """Fig. 9's row: the best (S, m) of the grid against (2, 2)."""
    scored = {k: r["final_metric"] for k, r in points.items() if r["final_metric"] is not None}
    if not scored:
        return []
    best = max(scored.values())
    winners = sorted(k for k, v in scored.items() if v == best)
    names = " and ".join(f"({s}, {m})" for s, m in winners)
    if GRID_BEST in scored:
        gap = scored[GRID_BEST] - best
        ours = f"best {metric} {best:.4g} at {names}; (2, 2): {scored[GRID_BEST]:.4g} ({gap:+.3g})"
        verdict = (
            "(2, 2) is best"
            if GRID_BEST in winners
            else f"(2, 2) is not best; its gap is {noise.judge(gap, noise.sd_metric)}"
        )
        figures[f"{task}_grid_S2_m2_gap_to_best"] = gap
    else:
        ours, verdict = f"best {metric} {best:.4g} at {names}; (2, 2) not run", "not checked"
    return [f"| Fig. 9 | (2, 2) learns best (translation) | {ours} | {noise.text} | {verdict} |"]


def _small_m_rows(task: str, points: dict, metric: str, noise: _SeedNoise, figures: dict) -> list[str]:
    """Fig. 10's rows: m = SMALL_M against m = LARGE_M at each S the grid has both of."""
    lines = []
    for s in sorted({s for s, _ in points}):
        small, large = points.get((s, SMALL_M)), points.get((s, LARGE_M))
        if small is None or large is None:
            continue
        parts, verdicts = [], []
        # (record key, its name, +1 where higher is better, the seed sd it is judged against)
        for key, name, better, sd in (
            ("final_metric", metric, 1, noise.sd_metric),
            ("early_loss", "early loss", -1, noise.sd_loss),
        ):
            if small[key] is None or large[key] is None:
                continue
            gap = small[key] - large[key]
            parts.append(f"{name} m={SMALL_M} minus m={LARGE_M}: {gap:+.3g}")
            sign = "the paper's sign" if better * gap > 0 else "not the paper's sign"
            verdicts.append(f"{name}: {sign}, {noise.judge(gap, sd)}")
            figures[f"{task}_grid_S{s}_m{SMALL_M}_minus_m{LARGE_M}_{name.replace(' ', '_')}"] = gap
        if parts:
            lines.append(
                f"| Fig. 10 | smaller m converges better (NER) | S = {s}: {'; '.join(parts)} | {noise.text} | "
                f"{'; '.join(verdicts)} |"
            )
    return lines
