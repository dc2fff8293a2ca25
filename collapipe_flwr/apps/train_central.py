"""Central reference training: one task, the plain (unsplit, unfederated) model, a wall-clock budget.

    python -m collapipe_flwr.apps.train_central task=<translation|ner|classification> [hydra overrides]
        [--minutes 15] [--max-steps N] [--train-examples N] [--threads 1] [--precision auto|fp32|bf16]
        [--device cpu|cuda|auto] [--test] [--save DIR] [--json FILE]

The step is the paper's local update with the whole model in one process: embedding -> L TEBs ->
head.loss_terms -> loss = sum / count, one optimizer (model.optimizer) with the warm-up + decay of
model.lr_schedule. Training stops when the budget minus the (measured) evaluation time is used up; then the
validation split is evaluated and the task metric is printed as the LAST line of stdout
(``bleu: 23.10``, ``f1: 0.6100``, ``accuracy: 0.7200``). Progress goes to stderr. ``--test`` also
evaluates the test files named in the task config (never used while tuning). ``--precision bf16`` runs
the forward passes (training and evaluation) under ``torch.autocast`` with bfloat16 (weights, gradients
and optimizer state stay fp32); on CPUs with AVX512-BF16 a translation step took 0.37-0.45 s instead of
0.66-0.69 s here. Without ``--precision`` the config's ``runtime.precision`` (default ``auto``: bf16 only
where the CPU has it natively, see collapipe_flwr/precision.py) decides. ``--save DIR`` writes the trained
model in the collapipe_flwr.model_store format to ``DIR/model/`` (``python -m collapipe_flwr.apps.evaluate DIR``
evaluates it again). The final evaluation runs under ``eval.precision`` (default ``runtime``: the training's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from collapipe_flwr import wiring
from collapipe_flwr.accelerator import DEVICES, batch_to, resolve_device
from collapipe_flwr.config import EvalSpec, RunConfig, load_run_config
from collapipe_flwr.errors import ConfigError, exit_on_user_error
from collapipe_flwr.model_store import save_model
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.pipeline.optim import scale_lr
from collapipe_flwr.precision import PRECISIONS, autocast, resolve_precision
from collapipe_flwr.tasks.base import Task
from collapipe_flwr.tasks.metrics import format_metric


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m collapipe_flwr.apps.train_central", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. task=ner model=bert_small task.batch_size=32"
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget for training + final evaluation")
    parser.add_argument(
        "--max-steps", type=int, default=0, help="stop after this many optimizer steps (0 = budget only)"
    )
    parser.add_argument(
        "--train-examples", type=int, default=0, help="train on the first N training examples (0 = all)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core machine 2 threads ran NER ~9x slower per step; 0 = torch's "
        "default)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="bf16: autocast the forward passes to bfloat16 (mixed precision); auto: bf16 only where native "
        "(default: the config's runtime.precision, else auto)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="where the model trains: cpu, cuda, or auto (cuda when a GPU is visible); default: the config's "
        "runtime.device",
    )
    parser.add_argument(
        "--eval-every-s",
        type=float,
        default=0.0,
        help="also evaluate every this many seconds of training (the final evaluation's slice; its time is not "
        "charged to the budget); the readings go to the JSON's val_history (0 = only at the end)",
    )
    parser.add_argument("--test", action="store_true", help="also evaluate the test split named in the task config")
    parser.add_argument("--save", default="", help="write the trained model to DIR/model/ (safetensors + model.json)")
    parser.add_argument("--json", default="", help="write the final metrics and settings to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_intermixed_args(argv)


def _progress(quiet: bool):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=Console(stderr=True),
        disable=quiet,
        transient=False,
    )


def _train_mode(model: SplitModel) -> None:
    """Every part of the model (embedding, the L TEBs, head) in training mode."""
    for part in (model.embedding, model.blocks, model.head):
        part.train()


def _optimizer(task: Task, model: SplitModel):
    """model.optimizer over every parameter of the plain model, and its base learning rates (one per group)."""
    params = [p for part in (model.embedding, model.blocks, model.head) for p in part.parameters()]
    optimizer = task.model_spec.optimizer.build(params)
    return optimizer, [g["lr"] for g in optimizer.param_groups]


def _train_step(
    model: SplitModel, optimizer, batch, factor: float, base_lrs: list[float], precision: str, device_type: str
) -> float:
    """One local update at lr = base lr * ``factor``: loss = sum / count of head.loss_terms, backward, step."""
    scale_lr(optimizer, base_lrs, factor)
    optimizer.zero_grad(set_to_none=True)
    with autocast(precision, device_type):
        loss_sum, count = model.loss_terms(batch)
    loss = loss_sum / count
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _show_progress(
    progress, bar, completed: float, elapsed: float, status: str, quiet: bool, last_note: float
) -> float:
    """Advance the bar; off a terminal, also print the status every 30 s. Returns when it was last printed."""
    progress.update(bar, completed=completed, status=status)
    if not quiet and not progress.console.is_terminal and elapsed - last_note >= 30:
        last_note = elapsed
        progress.console.print(f"{elapsed:6.0f}s {status}")
    return last_note


def _probe_midway(
    task: Task, model: SplitModel, eval_cfg: EvalSpec, precision: str, device_type: str, console
) -> float:
    """Time the evaluation of a validation slice (back to train mode after), print it; the new reserve (s)."""
    with autocast(precision, device_type):
        reserve, probe = _measure_eval(task, model, eval_cfg)
    _train_mode(model)
    console.print(f"midway: {probe} (reserving {reserve:.0f}s for the final evaluation)")
    return reserve


@dataclass(frozen=True)
class TrainSettings:
    """How one central run trains: a wall-clock budget of ``minutes`` (training plus the final evaluation it leaves
    room for), at most ``max_steps`` optimizer steps (0 = the budget alone), the forward passes under ``precision``
    on ``device`` (the model's parts must be there already; batches are moved), a progress bar unless ``quiet``."""

    minutes: float
    max_steps: int = 0
    precision: str = "fp32"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    quiet: bool = False
    eval_every_s: float = 0.0  # also evaluate every this many seconds of training (0: only at the end)


def train(
    task: Task, model: SplitModel, settings: TrainSettings, indices: list[int], seed: int, eval_cfg: EvalSpec
) -> dict:
    """Train on ``indices`` until the budget (minus the evaluation it must leave room for) or ``max_steps`` of
    ``settings`` is used. With ``eval_every_s`` the model is also evaluated every that many seconds of training, the
    clock paused meanwhile, so ``seconds`` in ``val_history`` (and ``train_seconds``) count training alone: what a
    time-to-quality comparison needs (benchmarks/time_to_quality.py)."""
    max_steps, precision, device, quiet = settings.max_steps, settings.precision, settings.device, settings.quiet
    eval_precision = resolve_precision(eval_cfg.resolved_precision(precision), device.type)  # eval.precision
    optimizer, base_lrs = _optimizer(task, model)
    lr_schedule = task.model_spec.lr_schedule
    budget = settings.minutes * 60.0
    start = time.monotonic()
    reserve = _eval_reserve_guess(task, eval_cfg)
    step, epoch, losses, history, val_history = 0, 0, [], [], []
    next_eval = settings.eval_every_s
    probed = False
    last_note = 0.0
    _train_mode(model)
    with _progress(quiet) as progress:
        bar = progress.add_task(f"train {task.name}", total=budget, status="")
        done = False
        while not done:
            for cpu_batch in task.batches(indices, task.batch_size, seed=seed + epoch):
                batch = batch_to(cpu_batch, device)
                elapsed = time.monotonic() - start
                train_budget = max(1.0, budget - reserve)
                if (max_steps and step >= max_steps) or elapsed >= train_budget:
                    done = True
                    break
                expected_steps = max(step + 1, round((step + 1) * train_budget / max(elapsed, 1e-3)))
                factor = lr_schedule.factor(step, expected_steps)
                losses.append(_train_step(model, optimizer, batch, factor, base_lrs, precision, device.type))
                step += 1
                if step % 20 == 0:
                    history.append(
                        {"step": step, "epoch": epoch, "seconds": round(elapsed, 1), "loss": sum(losses[-20:]) / 20}
                    )
                recent = sum(losses[-20:]) / len(losses[-20:])
                status = f"epoch {epoch} step {step} loss {recent:.3f} lr {base_lrs[0] * factor:.2e}"
                last_note = _show_progress(progress, bar, min(budget, elapsed), elapsed, status, quiet, last_note)
                if settings.eval_every_s and time.monotonic() - start >= next_eval:
                    reading, spent = _evaluate(task, model, eval_cfg, eval_precision, device.type)
                    val_history.append({"step": step, "seconds": round(time.monotonic() - start - spent, 1), **reading})
                    start += spent  # the clock counts training alone
                    next_eval = time.monotonic() - start + settings.eval_every_s
                if not probed and not max_steps and elapsed >= 0.5 * train_budget:
                    probed = True
                    reserve = _probe_midway(task, model, eval_cfg, precision, device.type, progress.console)
            epoch += 1
    return {
        "steps": step,
        "epochs_started": epoch,
        "train_seconds": time.monotonic() - start,
        "first_loss": losses[0] if losses else math.nan,
        "last_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "history": history,
        **({"val_history": val_history} if settings.eval_every_s else {}),
    }


def _evaluate(task: Task, model: SplitModel, eval_cfg: EvalSpec, eval_precision: str, device_type: str):
    """The validation metrics of the model as it stands on ``eval_cfg``'s slice under ``eval_precision``, and the
    seconds they took; the model back in train mode after (the evaluations during training and the final one)."""
    t0 = time.monotonic()
    with torch.no_grad(), autocast(eval_precision, device_type):
        metrics = task.evaluate(
            model, max_examples=eval_cfg.max_examples, batch_size=eval_cfg.batch_size, beam_size=eval_cfg.beam_size
        )
    _train_mode(model)
    return metrics, time.monotonic() - t0


def _eval_reserve_guess(task: Task, eval_cfg: EvalSpec) -> float:
    """Seconds kept for the final evaluation before it is measured midway (a tenth of a minute per 100 examples)."""
    n = len(task.val_examples())
    if eval_cfg.max_examples:
        n = min(n, eval_cfg.max_examples)
    return 6.0 * n / 100.0


def _measure_eval(task: Task, model: SplitModel, eval_cfg: EvalSpec) -> tuple[float, dict]:
    """Time the evaluation of a validation slice; return (seconds the full evaluation needs, slice metrics)."""
    n = len(task.val_examples())
    if eval_cfg.max_examples:
        n = min(n, eval_cfg.max_examples)
    probe_n = min(n, 128)
    t0 = time.monotonic()
    metrics = task.evaluate(model, max_examples=probe_n, batch_size=eval_cfg.batch_size, beam_size=eval_cfg.beam_size)
    seconds = time.monotonic() - t0
    shown = {k: round(v, 4) for k, v in metrics.items() if k != "examples"}
    return 1.8 * seconds * n / probe_n + 10.0, shown


def _describe(
    task: Task, model: SplitModel, n_train: int, args: argparse.Namespace, device: torch.device, requested: str
) -> str:
    """The run's one-line header: examples, model family and size, b, budget, threads, device, precision."""
    num_params = sum(p.numel() for part in (model.embedding, model.blocks, model.head) for p in part.parameters())
    return (
        f"task {task.name}: {n_train} train / {len(task.val_examples())} val examples, model "
        f"{task.model_spec.family} with {num_params / 1e6:.2f}M parameters, b={task.batch_size}, "
        f"budget {args.minutes:g} min, {torch.get_num_threads()} threads, device {device}, precision {args.precision}"
        + (f" ({requested})" if requested != args.precision else "")
    )


def _save(
    args: argparse.Namespace,
    cfg: RunConfig,
    data_dir: Path,
    task: Task,
    model: SplitModel,
    summary: dict,
    metrics: dict,
) -> None:
    """--save: the trained model in the model_store format, with what it reached (steps, val, test)."""
    info = {
        "saved_by": "train_central",
        "steps": summary["steps"],
        "train_seconds": round(summary["train_seconds"], 1),
        "precision": args.precision,
        "val": metrics,
        **({"test": summary["test"]} if args.test else {}),
    }
    saved_cfg = {**cfg.to_dict(), "data_dir": str(data_dir)}
    folder = save_model(args.save, saved_cfg, model.embedding, model.blocks, model.head, info, task=task)
    print(f"saved the model to {folder}", file=sys.stderr)


def _write_json(args: argparse.Namespace, cfg: RunConfig, device: torch.device, summary: dict) -> None:
    """--json: the task, model, seed, budget, precision, device and threads with the run's summary."""
    Path(args.json).write_text(
        json.dumps(
            {
                "task": cfg.task.to_raw(),
                "model": cfg.model.to_raw(),
                "seed": cfg.seed,
                "minutes": args.minutes,
                "precision": args.precision,
                "device": str(device),
                "threads": torch.get_num_threads(),
                **summary,
            },
            indent=2,
        )
    )


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.minutes <= 0:
        raise ConfigError(f"--minutes={args.minutes} must be > 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_run_config(args.overrides)  # the same one config path as flwr run and the sweep
    seed, eval_cfg = cfg.seed, cfg.eval
    device = resolve_device(args.device or cfg.runtime.device, "--device")
    requested = args.precision or cfg.runtime.precision
    args.precision = resolve_precision(requested, device.type)
    data_dir = cfg.resolved_data_dir()
    task = wiring.build_task(cfg)
    torch.manual_seed(seed)
    model = task.build_model(seed)
    for part in (model.embedding, model.blocks, model.head):
        part.to(device)
    n_train = len(task.train_examples())
    indices = list(range(n_train if not args.train_examples else min(n_train, args.train_examples)))
    task.features_at("train", indices)  # encoded before the clock starts, as every other run's set-up
    task.features("val")
    print(_describe(task, model, len(indices), args, device, requested), file=sys.stderr)
    t0 = time.monotonic()
    if args.eval_every_s < 0:
        raise ConfigError(f"--eval-every-s={args.eval_every_s} must be >= 0 (0: evaluate only at the end)")
    settings = TrainSettings(args.minutes, args.max_steps, args.precision, device, args.quiet, args.eval_every_s)
    summary = train(task, model, settings, indices, seed, eval_cfg)
    eval_precision = resolve_precision(eval_cfg.resolved_precision(args.precision), device.type)  # eval.precision
    metrics, _ = _evaluate(task, model, eval_cfg, eval_precision, device.type)
    summary.update(eval_seconds=time.monotonic() - t0 - summary["train_seconds"], total_seconds=time.monotonic() - t0)
    summary["val"] = metrics
    summary["eval_precision"] = eval_precision
    if args.test:
        with torch.no_grad(), autocast(eval_precision, device.type):
            summary["test"] = task.evaluate(
                model, batch_size=eval_cfg.batch_size, beam_size=eval_cfg.beam_size, split="test"
            )
        print("test " + ", ".join(f"{k}={v:.4f}" for k, v in summary["test"].items()), file=sys.stderr)
    if args.save:
        _save(args, cfg, data_dir, task, model, summary, metrics)
    if args.json:
        _write_json(args, cfg, device, summary)
    print(
        f"trained {summary['steps']} steps ({summary['train_seconds']:.0f}s), evaluated in "
        f"{summary['eval_seconds']:.0f}s; val " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()),
        file=sys.stderr,
    )
    print(format_metric(task.metric_name, metrics[task.metric_name]), flush=True)
    return summary


if __name__ == "__main__":
    main()
