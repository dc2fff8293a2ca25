"""The training runs read once into summaries (one dict a run), and the paired comparisons over them."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from reportlib.records import read_json
from reportlib.stats import plus_minus

from collapipe_flwr.experiments import aggregate
from collapipe_flwr.experiments.aggregate import cumulative
from collapipe_flwr.experiments.runs import RunData, find_run_paths, load_runs

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


def fmt(values: list[float], digits: int = 3) -> str:
    return f"{plus_minus(values, digits)} (n={len(values)})" if values else "-"


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


def read_central(root: Path, task: str) -> dict | None:
    """The central reference of ``task`` (``<task>/central/seed0/central.json``, written by
    ``python -m collapipe_flwr.apps.train_central --json``), None when it has not run."""
    path = root / task / "central" / "seed0" / "central.json"
    return read_json(path) if path.is_file() else None


def by_method(runs: list[dict]) -> dict[str, list[dict]]:
    """The finished runs of ``runs`` by method, in order."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        if r["ok"]:
            out[r["method"]].append(r)
    return out
