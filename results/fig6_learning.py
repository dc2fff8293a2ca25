"""Figs. 6, 9 and 10 from training runs: learning per method (three seeds) and over (S, m).

    python results/fig6_learning.py ROOT --out results/training

ROOT is the folder `bash results/training_runs.sh ROOT` filled: ``<task>/methods/seed<s>/`` (the five methods),
``<task>/long/`` (longer runs, reported as ``<task>_long``), ``<task>/grid/`` (a uniform split over S devices
with a fixed m, seed 0), ``<task>/grid_nodropout/`` (the same with dropout 0, reported as
``<task>_no_dropout``), ``<task>/grid_joint/`` (dropout 0 and ``decoder_update: joint``, reported as
``<task>_no_dropout_joint``) and ``<task>/repeat/`` (CollaPipe again with a methods run's config and seed: the
noise floor of the same seed). Every run is read with the report's own reader
(``collapipe_flwr.experiments.runs``) and per-round series (``aggregate.series``). Writes
``OUT/learning.md`` (per task: final metric and training loss, mean +- sd over seeds, the paper's comparisons as
paired per-seed gaps, and how far the learning of the gradient-exact methods differs), ``OUT/grid.md``
(Figs. 9-10), ``OUT/runs.csv`` and PNGs, and prints ``name: value`` lines.

The paper's statements these numbers are set beside (Section VI.C-D):
- Fig. 6d: translation BLEU "improved by 19.5% compared to baselines";
- Fig. 6c: classification accuracy "outperforms the PipeLine and TITANIC mechanisms by about 1.82% and 0.15%";
- Figs. 6b/6e: NER "a faster reduction in training loss during the early stages of training";
- Fig. 9: translation "the optimal configuration ... S = 2 and m = 2, under which the best learning performance
  is achieved"; Fig. 10: NER "reducing the value of m improves convergence performance".
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collapipe_flwr.experiments import aggregate  # noqa: E402
from collapipe_flwr.experiments.aggregate import cumulative  # noqa: E402
from collapipe_flwr.experiments.runs import RunData, find_run_paths, load_runs  # noqa: E402

TASKS = ("translation", "classification", "ner")
METHODS = ("collapipe", "collapipe_no_ss", "vanilla_fl", "titanic", "pipeline")
EXACT_PEERS = ("collapipe_no_ss", "titanic")  # same batch and gradient; only S, m and the devices differ
CSV_KEYS = ("method", "seed", "S", "m", "rounds", "final_metric", "final_loss", "early_loss", "compute_s", "delay_s")
CSV_KEYS += ("measured_s", "ok")
EARLY_ROUNDS = 10  # "early stages of training" (Figs. 6b/6e): the mean training loss over rounds 1..10
# The paper's margins (Section VI.C), each as (task, figure, key, the baselines it names, what the paper says).
# key "final_metric" is compared as a relative gap (% of the baseline, as the paper states it), "early_loss" as an
# absolute gap (negative = CollaPipe's loss falls faster).
PAPER_MARGINS = (
    ("translation", "Fig. 6d", "final_metric", METHODS[1:], "+19.5% BLEU compared to baselines"),
    ("translation", "Fig. 6a", "early_loss", METHODS[1:], "no significant difference in training loss"),
    ("classification", "Fig. 6c", "final_metric", ("pipeline", "titanic"), "+1.82% vs PipeLine, +0.15% vs TITANIC"),
    ("ner", "Figs. 6b/6e", "early_loss", METHODS[1:], "CollaPipe's loss falls faster early on"),
)


PART_SUFFIX = {"long": "_long", "grid_nodropout": "_no_dropout", "grid_joint": "_no_dropout_joint"}


def mean_sd(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(values: list[float], digits: int = 3) -> str:
    mean, sd = mean_sd(values)
    return "-" if not values else f"{mean:.{digits}f} +- {sd:.{digits}f} (n={len(values)})"


def run_summary(run: RunData) -> dict:
    s = aggregate.series(run.rounds)
    shape = aggregate.plan_shape(run.rounds)
    losses = [v for v in s["train_loss"] if v is not None]
    metrics = [(r, v) for r, v in zip(s["round"], s["metric"]) if v is not None]
    return {
        "run": run.name,
        "ok": run.ok,
        "task": run.labels.get("task"),
        "method": run.labels.get("method"),
        "seed": run.config.get("seed"),
        "metric": aggregate.metric_name(run.rounds),
        "rounds": len(s["round"]),
        "final_metric": metrics[-1][1] if metrics else None,
        "final_loss": losses[-1] if losses else None,
        "early_loss": statistics.fmean(losses[:EARLY_ROUNDS]) if len(losses) >= EARLY_ROUNDS else None,
        "loss": s["train_loss"],
        "metric_series": s["metric"],
        "round": s["round"],
        "delay_cum": cumulative(s["delay"]),
        "compute_s": sum(v for v in s["compute"] if v is not None),
        "delay_s": sum(v for v in s["delay"] if v is not None),
        "measured_s": sum(v for v in s["measured_train_s"] if v is not None),
        "S": shape.get("mean_S"),
        "m": shape.get("mean_m"),
    }


def gather(root: Path, task: str, part: str) -> list[dict]:
    folder = root / task / part
    if not folder.is_dir() or not find_run_paths(folder):  # a part not run (yet)
        return []
    return [run_summary(r) for r in load_runs(folder)]


def paired(by_method: dict, base: str, key: str) -> list[tuple[float, float]]:
    """(CollaPipe's, ``base``'s) value of ``key`` per seed both finished, by seed (a paired comparison removes the
    seed's data order and initialisation from the gap)."""
    ours = {r["seed"]: r[key] for r in by_method.get("collapipe", []) if r[key] is not None}
    theirs = {r["seed"]: r[key] for r in by_method.get(base, []) if r[key] is not None}
    return [(ours[s], theirs[s]) for s in sorted(ours.keys() & theirs.keys())]


def paired_gaps(by_method: dict, base: str, key: str) -> list[float]:
    """CollaPipe minus ``base`` on ``key``, per seed both finished."""
    return [a - b for a, b in paired(by_method, base, key)]


def max_loss_difference(by_method: dict, peer: str) -> float | None:
    """The largest |training loss of CollaPipe - of ``peer``| over rounds and seeds (same seed, same round)."""
    diffs = []
    for ours in by_method.get("collapipe", []):
        for theirs in by_method.get(peer, []):
            if theirs["seed"] != ours["seed"]:
                continue
            diffs += [abs(a - b) for a, b in zip(ours["loss"], theirs["loss"]) if a is not None and b is not None]
    return max(diffs) if diffs else None


def method_section(task: str, runs: list[dict], figures: dict) -> list[str]:
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        if r["ok"]:
            by_method[r["method"]].append(r)
    metric = next((r["metric"] for r in runs if r["metric"]), "metric")
    lines = [
        f"## {task}: learning per method (Fig. 6), metric = validation {metric}",
        "",
        f"| method | final {metric} | final train loss | mean train loss, rounds 1-{EARLY_ROUNDS} | mean S | mean m "
        "| modelled on-device compute (s) | modelled delay (s) | measured CU training (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        group = by_method.get(method, [])
        if not group:
            lines.append(f"| {method} | not run | | | | | | | |")
            continue

        def vals(key, group=group):
            return [r[key] for r in group if r[key] is not None]

        lines.append(
            f"| {method} | {fmt(vals('final_metric'), 4)} | {fmt(vals('final_loss'))} | {fmt(vals('early_loss'))} | "
            f"{statistics.fmean(vals('S')):.2f} | {statistics.fmean(vals('m')):.2f} | "
            f"{statistics.fmean(vals('compute_s')):.1f} | {statistics.fmean(vals('delay_s')):.1f} | "
            f"{statistics.fmean(vals('measured_s')):.1f} |"
        )
        figures[f"{task}_final_metric_{method}"] = mean_sd(vals("final_metric"))[0]
        figures[f"{task}_final_loss_{method}"] = mean_sd(vals("final_loss"))[0]
    lines += [
        "",
        f"CollaPipe minus each baseline, paired by seed (mean +- sd over the seeds both finished; final {metric}, "
        f"and the mean training loss over rounds 1-{EARLY_ROUNDS}, negative = CollaPipe's loss falls faster):",
        "",
        f"| CollaPipe vs | final {metric} gap | relative gap (% of baseline) | early-loss gap |",
        "|---|---|---|---|",
    ]
    for base in METHODS[1:]:
        gaps = paired_gaps(by_method, base, "final_metric")
        rel = [100.0 * (a - b) / b for a, b in paired(by_method, base, "final_metric") if b]
        early = paired_gaps(by_method, base, "early_loss")
        lines.append(f"| {base} | {fmt(gaps, 4)} | {fmt(rel, 2)} | {fmt(early)} |")
        figures[f"{task}_gap_{metric}_vs_{base}"] = mean_sd(gaps)[0]
        figures[f"{task}_relative_gap_pct_vs_{base}"], figures[f"{task}_relative_gap_pct_sd_vs_{base}"] = mean_sd(rel)
        figures[f"{task}_early_loss_gap_vs_{base}"], figures[f"{task}_early_loss_gap_sd_vs_{base}"] = mean_sd(early)
    lines += [
        "",
        "Methods whose pipeline computes CollaPipe's gradient for the same batch (only S, m and the devices "
        "differ; dropout masks differ with them, so the curves are not bit-identical): the largest per-round "
        "|training loss difference| from CollaPipe, same seed:",
        "",
    ]
    for peer in EXACT_PEERS:
        diff = max_loss_difference(by_method, peer)
        lines.append(f"- {peer}: {'-' if diff is None else f'{diff:.2e}'}")
        if diff is not None:
            figures[f"{task}_max_loss_diff_{peer}"] = diff
    failed = [r for r in runs if not r["ok"]]
    lines += [f"- failed run: `{r['run']}`" for r in failed]
    return lines + [""]


def repeat_section(task: str, methods: list[dict], repeats: list[dict], figures: dict) -> list[str]:
    """The same-seed noise floor: CollaPipe's runs of ``<task>/repeat/`` against the methods part's CollaPipe run
    of the same seed (same config; only thread timing differs, e.g. the order in which the server's shared decoder
    takes the CUs' steps), the largest per-round |training loss difference| and the final metric's difference."""
    ours = {r["seed"]: r for r in methods if r["ok"] and r["method"] == "collapipe"}
    pairs = [(ours[r["seed"]], r) for r in repeats if r["ok"] and r["method"] == "collapipe" and r["seed"] in ours]
    if not pairs:
        return []
    lines = [
        f"### {task}: the same-seed noise floor (CollaPipe run again with the same config and seed)",
        "",
        "| seed | largest per-round |training loss difference| | final metric, first run | again | difference |",
        "|---|---|---|---|---|",
    ]
    for first, again in pairs:
        diff = max_loss_difference({"collapipe": [first], "again": [again]}, "again")
        gap = first["final_metric"] - again["final_metric"]
        lines.append(
            f"| {first['seed']} | {diff:.2e} | {first['final_metric']:.4f} | {again['final_metric']:.4f} | {gap:+.4f} |"
        )
        figures[f"{task}_repeat_seed{first['seed']}_max_loss_diff"] = diff
        figures[f"{task}_repeat_seed{first['seed']}_metric_diff"] = gap
    return lines + [""]


def read_central(root: Path, task: str) -> dict | None:
    """The central reference of ``task`` (``<task>/central/seed0/central.json``, written by
    ``python -m collapipe_flwr.apps.train_central --json``), None when it has not run."""
    import json

    path = root / task / "central" / "seed0" / "central.json"
    return json.loads(path.read_text()) if path.is_file() else None


def central_section(task: str, central: dict | None, methods: list[dict], figures: dict) -> list[str]:
    """The central recipe's validation metric (the plain model, no split, no federation, on the same whole
    validation split) and each method's final metric over it (mean over its seeds)."""
    if central is None:
        return []
    metric = next((r["metric"] for r in methods if r["metric"]), None)
    if metric is None or metric not in central.get("val", {}):
        return []
    ref = float(central["val"][metric])
    figures[f"{task}_central_{metric}"] = ref
    ratios = []
    for method in METHODS:
        values = [r["final_metric"] for r in methods if r["ok"] and r["method"] == method and r["final_metric"]]
        if values:
            ratio = statistics.fmean(values) / ref
            ratios.append(f"{method} {ratio:.3f}x")
            figures[f"{task}_over_central_{method}"] = ratio
    return [
        f"Central reference (the plain model trained on the central recipe of docs/central_training.md, "
        f"{central.get('steps')} steps in {central.get('train_seconds', 0):.0f} s, seed {central.get('seed')}, "
        f"the same whole validation split): **{metric} {ref:.4f}**. Final {metric} over it (mean over seeds): "
        + (", ".join(ratios) or "-")
        + ".",
        "",
    ]


def same_seed_floor(methods: list[dict], repeats: list[dict], key: str, relative: bool) -> float | None:
    """The largest |first run - the same config and seed again| of ``key`` over the repeated seeds (in % of the
    first run when ``relative``): how far two runs differ with nothing but thread timing between them."""
    ours = {r["seed"]: r for r in methods if r["ok"] and r["method"] == "collapipe"}
    diffs = []
    for again in repeats:
        first = ours.get(again["seed"]) if again["ok"] else None
        if first is None or first[key] is None or again[key] is None:
            continue
        diff = abs(first[key] - again[key])
        diffs.append(100.0 * diff / abs(first[key]) if relative and first[key] else diff)
    return max(diffs) if diffs else None


def margin_verdict(gaps: list[float], floor: float | None) -> str:
    """Whether the paired gaps are outside the noise: the 95% confidence interval of their mean (Student's t over
    the seeds) excludes 0 and the mean is larger than the same-seed floor."""
    from scipy import stats

    mean, sd = mean_sd(gaps)
    if len(gaps) < 2:
        return "one seed: no spread yet"
    half = float(stats.t.ppf(0.975, len(gaps) - 1)) * sd / len(gaps) ** 0.5
    inside = abs(mean) <= half or (floor is not None and abs(mean) <= floor)
    return f"{'within' if inside else 'outside'} the noise (95% CI +- {half:.3g})"


def margins_section(task: str, methods: list[dict], repeats: list[dict], figures: dict) -> list[str]:
    """Each paper margin of ``task`` beside ours: the paired gap per seed (mean +- sd), the same-seed floor and
    whether the gap is outside the noise (:func:`margin_verdict`)."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in methods:
        if r["ok"]:
            by_method[r["method"]].append(r)
    rows = [(fig, key, bases, claim) for t, fig, key, bases, claim in PAPER_MARGINS if t == task]
    if not rows or "collapipe" not in by_method:
        return []
    lines = [
        f"### {task}: the paper's margins against the noise",
        "",
        "| figure | paper | CollaPipe vs | our paired gap, mean +- sd (n seeds) | same-seed floor | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for fig, key, bases, claim in rows:
        relative = key == "final_metric"
        floor = same_seed_floor(methods, repeats, key, relative)
        for base in bases:
            pairs = paired(by_method, base, key)
            gaps = [100.0 * (a - b) / b if relative else a - b for a, b in pairs if not relative or b]
            if not gaps:
                lines.append(f"| {fig} | {claim} | {base} | not run | | |")
                continue
            unit = "%" if relative else ""
            floor_text = "-" if floor is None else f"{floor:.3g}{unit}"
            verdict = margin_verdict(gaps, floor)
            lines.append(f"| {fig} | {claim} | {base} | {fmt(gaps, 3)}{unit} | {floor_text} | {verdict} |")
            figures[f"{task}_margin_{key}_vs_{base}"] = mean_sd(gaps)[0]
    return lines + [""]


def grid_section(task: str, runs: list[dict], figures: dict) -> list[str]:
    ok = sorted((r for r in runs if r["ok"]), key=lambda r: (r["S"] or 0, r["m"] or 0))
    if not ok:
        return []
    metric = next((r["metric"] for r in ok if r["metric"]), "metric")
    ref = ok[0]
    lines = [
        f"## {task}: learning over (S, m) (Figs. 9-10), uniform split, seed 0, metric = validation {metric}",
        "",
        f"| S | m | final {metric} | final train loss | largest per-round |loss - loss at S={ref['S']:.0f}, "
        f"m={ref['m']:.0f}| | modelled delay (s) |",
        "|---|---|---|---|---|---|",
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
    peers = [r for r in methods if r["ok"] and r["method"] == GRID_METHOD]
    sd_metric = mean_sd([r["final_metric"] for r in peers if r["final_metric"] is not None])[1] if peers else None
    sd_loss = mean_sd([r["early_loss"] for r in peers if r["early_loss"] is not None])[1] if peers else None
    noise = (
        f"seed sd of {GRID_METHOD} (n={len(peers)}): {metric} {sd_metric:.3g}, early loss {sd_loss:.3g}"
        if len(peers) > 1
        else "no seed spread of the grid's method yet"
    )

    def against_noise(gap: float, sd: float | None) -> str:
        if sd is None or len(peers) < 2:
            return "no seed spread to judge it against"
        return "larger than the seed sd" if abs(gap) > sd else "within the seed sd"

    lines = [
        f"### {task}: the paper's (S, m) claims beside the grid",
        "",
        "| figure | paper | ours (seed 0) | noise | verdict |",
        "|---|---|---|---|---|",
    ]
    scored = {k: r["final_metric"] for k, r in points.items() if r["final_metric"] is not None}
    if scored:
        best = max(scored.values())
        winners = sorted(k for k, v in scored.items() if v == best)
        names = " and ".join(f"({s}, {m})" for s, m in winners)
        if GRID_BEST in scored:
            gap = scored[GRID_BEST] - best
            ours = f"best {metric} {best:.4g} at {names}; (2, 2): {scored[GRID_BEST]:.4g} ({gap:+.3g})"
            verdict = (
                "(2, 2) is best"
                if GRID_BEST in winners
                else f"(2, 2) is not best; its gap is {against_noise(gap, sd_metric)}"
            )
            figures[f"{task}_grid_S2_m2_gap_to_best"] = gap
        else:
            ours, verdict = f"best {metric} {best:.4g} at {names}; (2, 2) not run", "not checked"
        lines.append(f"| Fig. 9 | (2, 2) learns best (translation) | {ours} | {noise} | {verdict} |")
    for s in sorted({s for s, _ in points}):
        small, large = points.get((s, SMALL_M)), points.get((s, LARGE_M))
        if small is None or large is None:
            continue
        parts, verdicts = [], []
        # (record key, its name, +1 where higher is better, the seed sd it is judged against)
        for key, name, better, sd in (
            ("final_metric", metric, 1, sd_metric),
            ("early_loss", "early loss", -1, sd_loss),
        ):
            if small[key] is None or large[key] is None:
                continue
            gap = small[key] - large[key]
            parts.append(f"{name} m={SMALL_M} minus m={LARGE_M}: {gap:+.3g}")
            sign = "the paper's sign" if better * gap > 0 else "not the paper's sign"
            verdicts.append(f"{name}: {sign}, {against_noise(gap, sd)}")
            figures[f"{task}_grid_S{s}_m{SMALL_M}_minus_m{LARGE_M}_{name.replace(' ', '_')}"] = gap
        if parts:
            lines.append(
                f"| Fig. 10 | smaller m converges better (NER) | S = {s}: {'; '.join(parts)} | {noise} | "
                f"{'; '.join(verdicts)} |"
            )
    return lines + [""]


# One look per method, so that methods whose curves coincide (the gradient-exact peers) stay visible: CollaPipe
# drawn last, thick and solid, the others dashed / dotted with markers.
STYLE = {
    "collapipe": {"color": "C3", "linestyle": "-", "linewidth": 2.4, "zorder": 5},
    "collapipe_no_ss": {"color": "C0", "linestyle": "--", "marker": "o"},
    "titanic": {"color": "C2", "linestyle": ":", "marker": "s"},
    "pipeline": {"color": "C1", "linestyle": "-.", "marker": "^"},
    "vanilla_fl": {"color": "C4", "linestyle": "--", "marker": "x"},
}


def _band(ax, x, values: np.ndarray, method: str, label: str) -> None:
    """Mean over seeds with a +- sd band, in the method's look."""
    mean, sd = values.mean(axis=0), values.std(axis=0)
    style = dict(STYLE.get(method, {}))
    if "marker" in style:
        style["markevery"] = max(1, len(x) // 8)
    ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, mean - sd, mean + sd, color=style.get("color"), alpha=0.15)


def plot_methods(task: str, runs: list[dict], path: Path) -> None:
    """Training loss against rounds and against the modelled delay; the validation metric against rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_t, ax_m) = plt.subplots(1, 3, figsize=(15, 4))
    for method in sorted(METHODS, key=lambda m: m == "collapipe"):  # CollaPipe drawn last, on top
        group = [r for r in runs if r["ok"] and r["method"] == method]
        if not group:
            continue
        n = min(len(r["loss"]) for r in group)
        losses = np.array([r["loss"][:n] for r in group], dtype=float)
        _band(ax_r, np.array(group[0]["round"][:n]), losses, method, f"{method} (n={len(group)})")
        delay = np.array([[np.nan if v is None else v for v in r["delay_cum"][:n]] for r in group]).mean(axis=0)
        ax_t.plot(delay, losses.mean(axis=0), **{k: v for k, v in STYLE.get(method, {}).items() if k != "marker"})
        scored = [[(t, v) for t, v in zip(r["round"], r["metric_series"]) if v is not None] for r in group]
        k = min(len(s) for s in scored)
        if k:
            values = np.array([[v for _, v in s[:k]] for s in scored], dtype=float)
            _band(ax_m, np.array([t for t, _ in scored[0][:k]]), values, method, method)
    metric = next((r["metric"] for r in runs if r.get("metric")), "metric")
    ax_r.set(xlabel="communication round t", ylabel="training loss (mean +- sd over seeds)", title=f"{task}: Fig. 6")
    ax_t.set(xlabel="modelled cumulative delay sum_t tau(t) (s, eq. 26)", ylabel="training loss", title="over time")
    ax_m.set(xlabel="communication round t", ylabel=f"validation {metric} (mean +- sd)", title="metric")
    ax_r.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_grid(task: str, runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in sorted((r for r in runs if r["ok"]), key=lambda r: (r["S"], r["m"])):
        ax.plot(r["round"], r["loss"], label=f"S={r['S']:.0f}, m={r['m']:.0f}: {r['metric']} {r['final_metric']:.3f}")
    ax.set(xlabel="communication round t", ylabel="training loss", title=f"{task}: Figs. 9-10 (seed 0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="the folder results/training_runs.sh wrote")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--source", default="training runs under ROOT (`bash results/training_runs.sh ROOT`)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, float] = {}
    where = args.source
    learning = [f"# Learning per method (Fig. 6): {where}", ""]
    grid = [f"# Learning over (S, m) (Figs. 9-10): {where}", ""]
    csv = [",".join(("task", "part", *CSV_KEYS))]
    for task in TASKS:
        gathered: dict[str, list[dict]] = {}
        for part, section, plot, out, figure in (
            ("methods", method_section, plot_methods, learning, "fig6"),
            ("long", method_section, plot_methods, learning, "fig6"),
            ("grid", grid_section, plot_grid, grid, "fig9_10"),
            ("grid_nodropout", grid_section, plot_grid, grid, "fig9_10"),
            ("grid_joint", grid_section, plot_grid, grid, "fig9_10"),
        ):
            runs = gathered[part] = gather(args.root, task, part)
            if not runs:
                continue
            label = task + PART_SUFFIX.get(part, "")  # the long runs, the dropout-free grid: own sections and keys
            out += section(label, runs, figures)
            if any(r["ok"] for r in runs):
                plot(label, runs, args.out / f"{figure}_{label}.png")
            for r in runs:
                values = [task, part] + [r[k] for k in CSV_KEYS]
                csv.append(",".join("" if v is None else str(v) for v in values))
        grid += grid_claims_section(task, gathered["grid"], gathered["methods"], figures)
        learning += central_section(task, read_central(args.root, task), gathered["methods"], figures)
        repeats = gather(args.root, task, "repeat")
        learning += repeat_section(task, gathered["methods"], repeats, figures)
        learning += margins_section(task, gathered["methods"], repeats, figures)
    (args.out / "learning.md").write_text("\n".join(learning) + "\n")
    (args.out / "grid.md").write_text("\n".join(grid) + "\n")
    (args.out / "runs.csv").write_text("\n".join(csv) + "\n")
    for name, value in figures.items():
        print(f"{name}: {value:.4g}")


if __name__ == "__main__":
    main()
