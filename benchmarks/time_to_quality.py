"""Time to quality: each task's federated ``long`` run against its central recipe on both cores, back to back.

    python benchmarks/time_to_quality.py [--tasks translation classification ner] [--out DIR]
        [--central-minutes 15] [--eval-every 2] [--table-only]

Per task, on one machine, one side right after the other (issue 64):

1. **central**: ``python -m collapipe_flwr.apps.train_central task=<t> <its recipe> --threads 2 --minutes M
   --eval-every-s 60 --json <DIR>/<t>/central.json`` (the recipes of docs/central_training.md): its final
   validation metric Q_c on the whole validation split, and its time to Q_c: the training seconds (the clock paused
   while it evaluates) of the first of its evaluations every 60 s of training (``val_history``) at or above Q_c,
   else all its training. A central run often reaches its final quality well before its budget ends (it
   overfits, or its learning rate has decayed), so its whole budget is only an upper bound on its time; a record
   kept without ``val_history`` has nothing else, and its row is judged "undecided" unless federated misses even
   that bound.
2. **federated**: ``collapipe run`` with ``overrides="federation=long task=<t> eval.every=K"`` (NER's ``long``
   carries the central NER recipe, conf/recipe/ner_long.yaml), its run folder ``<DIR>/<t>/federated``: per
   evaluated round, the metric on the whole validation split, the ServerApp's elapsed seconds and each round's
   evaluation seconds (rounds.jsonl ``measured_s.evaluate_s``).

The federated time to quality is the first evaluated round whose metric reaches Q_c: its elapsed seconds less
the evaluation seconds of every round up to it, plus Flower's start-up (the launcher's wall seconds less the
ServerApp's last elapsed seconds: an upper bound, it holds the teardown too). Neither side is charged for
evaluating. A run that never reaches Q_c is censored: its time is at least all of its training, and the target
is not met. Target: federated <= 1.1 x central, for every task.

``--table-only`` writes ``<DIR>/../table.md`` from the kept records without running anything (the default DIR is
results/time_to_quality/records, so the table is results/time_to_quality/table.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "results" / "time_to_quality" / "records"
TARGET_RATIO = 1.1
TASKS = ("translation", "classification", "ner")
METRIC = {"translation": "bleu", "classification": "accuracy", "ner": "f1"}
# the central recipes of docs/central_training.md (translation's and classification's are the defaults)
CENTRAL_RECIPE = {
    "translation": [],
    "classification": [],
    "ner": [
        "task.batch_size=32",
        "task.max_len=128",
        "task.extra_train_files=[chinese_ner/supplementary_msra/msra_bio.txt]",
        "model.optimizer.lr=0.0007",
        "model.lr_schedule.warmup_steps=100",
        "model.lr_schedule.min_factor=0.05",
        "model.dropout=0.2",
    ],
}


@dataclass(frozen=True)
class Side:
    """One side's figures: the quality it ended at, and the seconds it took to reach ``quality`` (None: never)."""

    quality: float
    seconds: float | None
    reached_at: str


CENTRAL_EVAL_EVERY_S = 60.0  # the central run's evaluations, in seconds of training (its time-to-quality grain)


def central_side(record: dict, metric: str) -> Side:
    """Central: its final validation metric Q_c, and the training seconds of its first evaluation at or above Q_c
    (``val_history``), else all its training; ``reached_at`` says which (module docstring)."""
    quality = float(record["val"][metric])
    if "val_history" not in record:  # an older record: the whole budget, an upper bound on its time
        seconds = float(record["total_seconds"]) - float(record["eval_seconds"])
        return Side(quality, seconds, f"{record['steps']} steps; its whole budget, an upper bound")
    for reading in record["val_history"]:
        if float(reading[metric]) >= quality:
            return Side(quality, float(reading["seconds"]), f"step {reading['step']} of {record['steps']}")
    return Side(quality, float(record["train_seconds"]), f"step {record['steps']}, its last")


def verdict(ratio: float, central: Side) -> str:
    """Met (<= TARGET_RATIO x central), missed, or undecided: a central time that is only an upper bound cannot
    show federated within 1.1x of it, only that federated misses it."""
    if ratio > TARGET_RATIO:
        return "no"
    return "undecided (central's time an upper bound)" if central.reached_at.endswith("upper bound") else "yes"


def read_rounds(run_dir: Path) -> list[dict]:
    """The run's rounds.jsonl (or its kept .gz copy), one dict per round."""
    plain, packed = run_dir / "rounds.jsonl", run_dir / "rounds.jsonl.gz"
    text = plain.read_text() if plain.is_file() else gzip.decompress(packed.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def federated_side(rounds: list[dict], status: dict, metric: str, target: float) -> Side:
    """Federated: its last evaluated metric, and the seconds to its first evaluated round at or above ``target``
    (see the module docstring: evaluation left out, Flower's start-up in)."""
    key, evaluated, spent_evaluating = f"val_{metric}", [], 0.0
    start_up = float(status["wall_s"]) - max(float(r.get("elapsed_s", 0.0)) for r in rounds)
    reached: Side | None = None
    for r in sorted(rounds, key=lambda r: r.get("round", 0)):
        spent_evaluating += float((r.get("measured_s") or {}).get("evaluate_s", 0.0))
        if key not in r:
            continue
        evaluated.append(float(r[key]))
        if reached is None and float(r[key]) >= target:
            seconds = float(r["elapsed_s"]) - spent_evaluating + start_up
            reached = Side(float(r[key]), seconds, f"round {r['round']}")
    if not evaluated:
        raise SystemExit(f"error: no round of the federated run has {key}; run it with eval.every >= 1")
    return reached or Side(evaluated[-1], None, "never")


def _run(cmd: list[str], log: Path) -> None:
    print("$ " + " ".join(cmd), flush=True)
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-10:]
        raise SystemExit(f"error: {cmd[2]} exited {done.returncode} (log {log}):\n" + "\n".join(tail))


def run_task(task: str, out: Path, minutes: float, eval_every: int, central_only: bool = False) -> None:
    """Central, then federated, for ``task``; the records under ``out/<task>`` (``central_only``: a central record
    run again beside a kept federated one, said in ``when.txt``)."""
    folder = out / task
    folder.mkdir(parents=True, exist_ok=True)
    central = [sys.executable, "-m", "collapipe_flwr.apps.train_central", f"task={task}", *CENTRAL_RECIPE[task]]
    central += ["--threads", "2", "--minutes", str(minutes), "--eval-every-s", str(CENTRAL_EVAL_EVERY_S)]
    central += ["--json", str(folder / "central.json")]
    _run(central, folder / "central.log")
    if central_only:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        with (folder / "when.txt").open("a") as when:
            when.write(f"central run again alone: {stamp}\n")
        return
    overrides = f"federation=long task={task} eval.every={eval_every}"
    federated = [sys.executable, "-m", "collapipe_flwr", "run", "--run-config"]
    federated += [f"output-dir='{folder}' run-name='federated' overrides='{overrides}'"]
    _run(federated, folder / "federated.log")
    rounds = folder / "federated" / "rounds.jsonl"  # kept packed: the table reads either
    rounds.with_suffix(".jsonl.gz").write_bytes(gzip.compress(rounds.read_bytes(), mtime=0))
    rounds.unlink()
    (folder / "when.txt").write_text(time.strftime("%Y-%m-%d %H:%M UTC\n", time.gmtime()))


def table(out: Path) -> str:
    """The markdown table of every task with kept records under ``out``."""
    lines = [
        "Generated by `python benchmarks/time_to_quality.py --table-only` from the records in `records/`; seconds",
        "leave evaluation out (the script's docstring). The target: federated <= 1.1x central.",
        "",
        "| task | central quality | central s | federated reached | federated s | ratio | <= 1.1x |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        folder = out / task
        if not (folder / "central.json").is_file() or not (folder / "federated" / "status.json").is_file():
            continue
        metric = METRIC[task]
        central = central_side(json.loads((folder / "central.json").read_text()), metric)
        status = json.loads((folder / "federated" / "status.json").read_text())
        fed = federated_side(read_rounds(folder / "federated"), status, metric, central.quality)
        assert central.seconds is not None
        if fed.seconds is None:
            reached, fed_s, ratio, met = f"never (ended {fed.quality:.4g})", "censored", "-", "no"
        else:
            ratio_value = fed.seconds / central.seconds
            reached, fed_s = f"{fed.quality:.4g} at {fed.reached_at}", f"{fed.seconds:.0f}"
            ratio, met = f"{ratio_value:.2f}x", verdict(ratio_value, central)
        lines.append(
            f"| {task} | {metric} {central.quality:.4g} ({central.reached_at}) | {central.seconds:.0f} "
            f"| {reached} | {fed_s} | {ratio} | {met} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--central-minutes", type=float, default=15.0)
    parser.add_argument("--eval-every", type=int, default=2, help="evaluate the federated run every K rounds")
    parser.add_argument("--table-only", action="store_true", help="write the table from the kept records")
    parser.add_argument(
        "--central-only", action="store_true", help="run the central side again, keeping the federated record"
    )
    args = parser.parse_args(argv)
    if not args.table_only:
        for task in args.tasks:
            run_task(task, args.out, args.central_minutes, args.eval_every, args.central_only)
    text = table(args.out)
    (args.out.parent / "table.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
