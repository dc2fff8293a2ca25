"""learning.md's sections: per method (Fig. 6), the central reference, the same-seed noise floor and the paper's
margins against the noise."""

from __future__ import annotations

import statistics

from reportlib import markdown as md
from reportlib.stats import mean_sd

from learning_sections.runs import (
    EARLY_ROUNDS,
    EXACT_PEERS,
    METHODS,
    PAPER_MARGINS,
    by_method,
    fmt,
    max_loss_difference,
    paired,
    paired_gaps,
)


def method_section(task: str, runs: list[dict], figures: dict) -> list[str]:
    """Fig. 6 for ``task``: each method's final metric, losses, plan and delays (mean +- sd over its seeds), then
    CollaPipe against each baseline paired by seed, then the gradient-exact peers' loss difference."""
    groups = by_method(runs)
    metric = next((r["metric"] for r in runs if r["metric"]), "metric")
    lines = [
        f"## {task}: learning per method (Fig. 6), metric = validation {metric}",
        "",
        *md.head(
            f"| method | final {metric} | final train loss | mean train loss, rounds 1-{EARLY_ROUNDS} | mean S "
            "| mean m "
            "| modelled on-device compute (s) | modelled delay (s) | measured CU training (s) |"
        ),
    ]
    lines += _method_rows(task, groups, figures)
    lines += _paired_gap_rows(task, metric, groups, figures)
    lines += _exact_peer_lines(task, groups, figures)
    failed = [r for r in runs if not r["ok"]]
    lines += [f"- failed run: `{r['run']}`" for r in failed]
    return lines + [""]


def _method_rows(task: str, groups: dict[str, list[dict]], figures: dict) -> list[str]:
    """One row a method: its final metric and losses (mean +- sd), mean plan and delays."""
    lines = []
    for method in METHODS:
        group = groups.get(method, [])
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
    return lines


def _paired_gap_rows(task: str, metric: str, groups: dict[str, list[dict]], figures: dict) -> list[str]:
    """CollaPipe minus each baseline, paired by seed: the final metric's gap (absolute, relative) and the early
    loss's."""
    lines = [
        "",
        f"CollaPipe minus each baseline, paired by seed (mean +- sd over the seeds both finished; final {metric}, "
        f"and the mean training loss over rounds 1-{EARLY_ROUNDS}, negative = CollaPipe's loss falls faster):",
        "",
        *md.head(f"| CollaPipe vs | final {metric} gap | relative gap (% of baseline) | early-loss gap |"),
    ]
    for base in METHODS[1:]:
        gaps = paired_gaps(groups, base, "final_metric")
        rel = [100.0 * (a - b) / b for a, b in paired(groups, base, "final_metric") if b]
        early = paired_gaps(groups, base, "early_loss")
        lines.append(f"| {base} | {fmt(gaps, 4)} | {fmt(rel, 2)} | {fmt(early)} |")
        figures[f"{task}_gap_{metric}_vs_{base}"] = mean_sd(gaps)[0]
        figures[f"{task}_relative_gap_pct_vs_{base}"], figures[f"{task}_relative_gap_pct_sd_vs_{base}"] = mean_sd(rel)
        figures[f"{task}_early_loss_gap_vs_{base}"], figures[f"{task}_early_loss_gap_sd_vs_{base}"] = mean_sd(early)
    return lines


def _exact_peer_lines(task: str, groups: dict[str, list[dict]], figures: dict) -> list[str]:
    """The largest per-round training loss difference of each gradient-exact peer from CollaPipe, same seed."""
    lines = [
        "",
        "Methods whose pipeline computes CollaPipe's gradient for the same batch (only S, m and the devices "
        "differ; dropout masks differ with them, so the curves are not bit-identical): the largest per-round "
        "|training loss difference| from CollaPipe, same seed:",
        "",
    ]
    for peer in EXACT_PEERS:
        diff = max_loss_difference(groups, peer)
        lines.append(f"- {peer}: {'-' if diff is None else f'{diff:.2e}'}")
        if diff is not None:
            figures[f"{task}_max_loss_diff_{peer}"] = diff
    return lines


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
        *md.head(
            "| seed | largest per-round |training loss difference| | final metric, first run | again | difference |"
        ),
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
    groups = by_method(methods)
    rows = [(fig, key, bases, claim) for t, fig, key, bases, claim in PAPER_MARGINS if t == task]
    if not rows or "collapipe" not in groups:
        return []
    lines = [
        f"### {task}: the paper's margins against the noise",
        "",
        *md.head(
            "| figure | paper | CollaPipe vs | our paired gap, mean +- sd (n seeds) | same-seed floor | verdict |"
        ),
    ]
    for fig, key, bases, claim in rows:
        relative = key == "final_metric"
        floor = same_seed_floor(methods, repeats, key, relative)
        for base in bases:
            pairs = paired(groups, base, key)
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
