"""Evaluate a saved model (collapipe_flwr.model_store format) on the validation or test split.

    python -m collapipe_flwr.apps.evaluate RUN_FOLDER [task.<key>=<value> ...] [--split val|test] [--data-dir DIR]
        [--max-examples N] [--batch-size N] [--beam-size N] [--precision auto|fp32|bf16] [--threads 1] [--json FILE]
        [--samples 3]

RUN_FOLDER is a folder written by ``train_central --save`` or a federated run (or its ``model/`` folder).
The task and model are rebuilt from the saved config, the weights loaded strictly, and the evaluation is
the server's validation call (``task.evaluate`` in eval mode under ``torch.no_grad`` and the precision's
autocast); max_examples / batch_size / beam_size default to the saved config's ``eval`` section, the
precision to its ``eval.precision`` (else its ``runtime.precision``, else auto). ``task.<key>=<value>`` changes
the saved task config, e.g. ``task.test_file=toutiao/test.txt`` to name a test split. All metrics go to
stderr; the LAST stdout line is the task metric (``bleu: 23.10``, ``f1: 0.6100``, ``accuracy: 0.7200``). A
causal_lm run also prints ``--samples`` greedy continuations (20 new tokens) of its split's first lines' first 3
words beside perplexity.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from collapipe_flwr.accelerator import DEVICES, resolve_device
from collapipe_flwr.errors import ConfigError, exit_on_user_error
from collapipe_flwr.model_store import load_model, model_dir_of, read_meta
from collapipe_flwr.precision import PRECISIONS, autocast, resolve_precision
from collapipe_flwr.tasks.metrics import format_metric
from collapipe_flwr.tasks.registry import task_class
from collapipe_flwr.tasks.spec import TaskSpec, parse_task

EVALUATED_SPLITS = ("val", "test")  # the splits a saved model can be evaluated on (never train)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m collapipe_flwr.apps.evaluate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", help="run folder holding model/ (or the model/ folder itself)")
    parser.add_argument("overrides", nargs="*", help="task.<key>=<value> changes to the saved task config")
    parser.add_argument(
        "--split", choices=EVALUATED_SPLITS, default="val", help="which split to evaluate (default val)"
    )
    parser.add_argument("--data-dir", default="", help="dataset folder (default: saved data_dir, $COLLAPIPE_DATA_DIR)")
    parser.add_argument("--max-examples", type=int, help="first N examples (0 = all; default: eval.max_examples)")
    parser.add_argument("--batch-size", type=int, help="batch size (default: eval.batch_size, else 64)")
    parser.add_argument("--beam-size", type=int, help="translation beam (1 = greedy; default: eval.beam_size)")
    parser.add_argument(
        "--precision", choices=PRECISIONS, help="default: the saved eval.precision, else runtime.precision, else auto"
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        help="cpu, cuda or auto (cuda when a GPU is visible); default: the saved runtime.server_device / "
        "runtime.device, else cpu",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    parser.add_argument("--json", default="", help="write the metrics and settings to this JSON file")
    parser.add_argument("--samples", type=int, default=3, help="causal_lm: generated samples to print (0 = none)")
    return parser.parse_intermixed_args(argv)


def task_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``task.<key>=<value>`` strings -> {key: value} (values parsed as YAML scalars)."""
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("task.") or len(key) <= len("task."):
            raise ConfigError(f"override {item!r} is not task.<key>=<value>; only the task config can be changed here")
        out[key[len("task.") :]] = yaml.safe_load(value) if value else ""
    return out


def check_split(task: TaskSpec, split: str) -> None:
    """One-line error when the task config names no files for ``split`` (say which keys to set)."""
    if task.hf_enabled:
        return
    keys = sorted(k for k in task_class(task.name).task_keys if k.startswith(f"{split}_"))
    empty = [k for k in keys if not task.options.get(k)]
    if empty:
        names = " ".join(f"task.{k}=<file>" for k in empty)
        what = f"the saved {task.name} config names no {split} split"
        raise ConfigError(f"{what}; pass {names} (relative to data_dir) or use --split val")


def eval_settings(args: argparse.Namespace, eval_cfg: Mapping[str, Any]) -> dict[str, int]:
    """max_examples / batch_size / beam_size: the flags, else the saved eval section, else the defaults."""
    chosen = {
        "max_examples": args.max_examples if args.max_examples is not None else int(eval_cfg.get("max_examples", 0)),
        "batch_size": args.batch_size if args.batch_size is not None else int(eval_cfg.get("batch_size", 64)),
        "beam_size": args.beam_size if args.beam_size is not None else int(eval_cfg.get("beam_size", 1)),
    }
    if chosen["max_examples"] < 0:
        raise ConfigError(f"--max-examples={chosen['max_examples']} must be >= 0 (0 = the whole split)")
    for key in ("batch_size", "beam_size"):
        if chosen[key] < 1:
            raise ConfigError(f"--{key.replace('_', '-')}={chosen[key]} must be >= 1")
    return chosen


def evaluate_model(
    task,
    model,
    split: str,
    precision: str,
    max_examples: int,
    batch_size: int,
    beam_size: int,
    device: torch.device | None = None,
) -> dict:
    """The server's validation call on ``split`` with the model in eval mode (moved to ``device`` if given)."""
    device = device if device is not None else torch.device("cpu")
    for part in model.parts():
        part.to(device)
        part.eval()
    with torch.no_grad(), autocast(precision, device.type):
        metrics = task.evaluate(
            model, max_examples=max_examples, batch_size=batch_size, beam_size=beam_size, split=split
        )
    return dict(metrics)


def causal_lm_samples(task, model, split: str, count: int, device: torch.device) -> list[dict[str, str]]:
    """Greedy 20-token continuations of the first 3 words of the split's first ``count`` lines, generated by the
    un-split Hugging Face model with the adapters merged (docs/hf_export.md)."""
    from collapipe_flwr.models.hf.generation import Sampling, continuations
    from collapipe_flwr.models.hf.peft_export import merged_copy, unsplit_model

    examples = task.read_split(split)[:count]
    if task.translating:  # a translation run's sources, written as it trained (models/hf/prompting.py)
        prompts = [pair.src for pair in examples]
    else:
        prompts = [" ".join(line.split()[:3]) for line in examples]
    net = unsplit_model(model.embedding, merged_copy(model.blocks), model.head).to(device)
    texts = continuations(net, task.tokenizer(), prompts, Sampling(max_new_tokens=20), task.format)
    return [{"prompt": p, "continuation": t} for p, t in zip(prompts, texts)]


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.samples < 0:
        raise ConfigError(f"--samples={args.samples} must be >= 0 (0 = no generated samples)")
    if args.threads:
        torch.set_num_threads(args.threads)
    changes = task_overrides(args.overrides)
    meta = read_meta(model_dir_of(args.folder))
    saved = meta["config"]
    check_split(parse_task({**saved["task"], **changes}), args.split)
    settings = eval_settings(args, saved.get("eval") or {})
    runtime = saved.get("runtime") or {}
    device = resolve_device(
        args.device or str(runtime.get("server_device") or runtime.get("device") or "cpu"), "--device"
    )
    saved_eval = str((saved.get("eval") or {}).get("precision") or "runtime")  # eval.precision, then runtime's
    requested = args.precision or (saved_eval if saved_eval != "runtime" else str(runtime.get("precision") or "auto"))
    precision = resolve_precision(requested, device.type)
    cfg, task, model = load_model(args.folder, data_dir=args.data_dir or None, task_overrides=changes)
    shown = " ".join(f"{k}={v}" for k, v in settings.items())
    print(
        f"evaluating {cfg['task']['name']} / {cfg['model'].get('name')} from {args.folder} on {args.split}: {shown}, "
        f"device {device}, precision {precision}, {torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    metrics = evaluate_model(task, model, args.split, precision, **settings, device=device)
    print(f"{args.split} " + ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()), file=sys.stderr)
    samples = []
    if cfg["task"]["name"] == "causal_lm" and args.samples > 0:
        samples = causal_lm_samples(task, model, args.split, args.samples, device)
        for sample in samples:
            print(f"sample: {sample['prompt']!r} -> {sample['continuation']!r}", file=sys.stderr)
    if args.json:
        record = {
            "folder": str(args.folder),
            "split": args.split,
            "precision": precision,
            "device": str(device),
            "threads": torch.get_num_threads(),
            **settings,
            "metrics": metrics,
            **({"samples": samples} if samples else {}),
        }
        Path(args.json).write_text(json.dumps(record, indent=2))
    print(format_metric(task.metric_name, metrics[task.metric_name]), flush=True)
    return metrics


if __name__ == "__main__":
    main()
