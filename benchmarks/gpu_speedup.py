"""GPU against CPU on this machine (issue 16): the server's decoder / head step, and a whole federated round.

Prints ``name: value`` lines:
- cuda_available: 1 or 0. Without CUDA nothing else is measured (the figures stay open; the CPU path is
  what every other benchmark measures).
- decoder_step_cpu_ms / decoder_step_gpu_ms / decoder_step_gpu_speedup: one ``head_step`` (forward, loss,
  backward, optimizer step) of the server's decoder for ``--overrides`` (default ``task=translation
  model=transformer_small``, the model ``collapipe run`` trains) on a real training batch of b =
  task.batch_size with z_enc drawn at random; median over ``--steps`` steps after one warm-up, the GPU timed
  with ``torch.cuda.synchronize``. The CPU side runs on ``--cpu-threads`` threads (default 2, the cores of
  the machine the CPU figures in docs/benchmarks.md come from).
- <name>_cpu_ms / <name>_gpu_ms / <name>_gpu_speedup for each ``--also NAME=OVERRIDES`` (default: the
  paper-size Transformer's decoder, ``paper_decoder_step``, and BERT's classification head,
  ``bert_head_step``): the same measurement for other server modules.
- with ``--round``: ``collapipe run`` with ``preset='smoke'``, 2 CUs, ``--round-steps`` local steps (default 20)
  and ``--round-rounds`` rounds (default 4), all stages and the server on the CPU, then on the one GPU
  (``device='cuda'``, stages sharing it through ``runtime.actor_num_gpus`` = 1 / (N x K), rounded down). From
  its rounds.jsonl (``measured_s.round_s``, the CUs' ``seconds-*``):
  - round_first_cpu_s / round_first_gpu_s: the first round, which also starts each CU's device actors and
    builds its modules (``seconds-setup``); the smoke preset's 3 steps leave it almost all set-up;
  - round_later_cpu_s / round_later_gpu_s: the mean of the rounds after the first;
  - round_cpu_s / round_gpu_s / round_gpu_speedup: the mean of the rounds from the third on, the steady state
    (in the second, a new DSSRA plan often moves the blocks onto a device that held none yet, and that
    device's first segment costs seconds on a smoke run);
  - step_cpu_s / step_gpu_s / step_gpu_speedup: the median pipeline step (``seconds-step-total`` / ``steps``: embed,
    forward, head exchange, backward, update; a CU reports it summed over its round) over every CU and round.

Run: ``python benchmarks/gpu_speedup.py [--round | --round-only] [--overrides "task=translation
model=transformer_small"]`` (``--round-only``: the rounds without the module rows).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collapipe_flwr import wiring  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.pipeline.head import head_step  # noqa: E402


def decoder_step_ms(overrides: list[str], device: str, steps: int) -> float:
    """Median ms of one head_step on ``device`` (model sizes and b from the config)."""
    cfg = load_run_config(overrides)
    task = wiring.build_task(cfg)
    torch.manual_seed(0)
    model = wiring.build_model(task, cfg)
    head = model.head.to(device)
    optimizer = wiring.optimizer_spec(cfg).build(head.parameters())
    b = wiring.batch_size(cfg)
    batch = next(iter(task.batches(list(range(b)), b, seed=0, shuffle=False)))
    z = torch.randn(*batch["input_ids"].shape, cfg.model.width)
    times = []
    for i in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        head_step(head, optimizer, [z], [batch])
        if device == "cuda":
            torch.cuda.synchronize()
        if i:  # the first step warms up (allocator, kernels)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def gpu_share(num_clusters: int) -> float:
    """The GPU fraction per device actor that fits the smoke run's N x K actors on one GPU (0.166 for 2 CUs of
    conf/network/small's 3 devices; 0.25 would leave 2 actors pending: collapipe run refuses that)."""
    devices = load_run_config(["preset=smoke"]).network.devices_per_cluster
    return math.floor(1000 / (num_clusters * devices)) / 1000


def smoke_run_command(out: Path, overrides: list[str], device: str = "cpu") -> list[str]:
    """``collapipe run`` with ``preset='smoke'``, 2 CUs and ``overrides``, its run folder ``out/r``."""
    return [
        sys.executable,
        "-m",
        "collapipe_flwr",
        "run",
        "--run-config",
        f"preset='smoke' num-clusters=2 device='{device}' output-dir='{out}' run-name='r'",
        "--run-config",
        f"overrides='{' '.join(overrides)}'",
    ]


def round_figures(device: str, workdir: Path, local_steps: int, rounds: int) -> dict[str, float]:
    """The first round's, the later rounds' mean and the median step's seconds of a smoke ``collapipe run``
    with every role on ``device`` (see the module docstring)."""
    out = workdir / f"run-{device}"
    overrides = [f"federation.local_steps={local_steps}", f"federation.num_rounds={rounds}"]
    if device == "cuda":
        overrides.append(f"runtime.actor_num_gpus={gpu_share(2)}")
    done = subprocess.run(smoke_run_command(out, overrides, device), cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        log = out / "r" / "flwr.log"  # Flower's own log says why its side stopped
        tail += log.read_text(errors="replace").strip().splitlines()[-25:] if log.is_file() else []
        raise SystemExit(f"error: the {device} smoke run exited {done.returncode}:\n" + "\n".join(tail))
    records = [json.loads(line) for line in (out / "r" / "rounds.jsonl").read_text().splitlines() if line.strip()]
    trained = [r for r in records if r.get("measured_s", {}).get("round_s")]
    steps = [
        client["seconds-step-total"] / client["steps"]
        for r in trained
        for client in r.get("clients", {}).values()
        if client.get("steps")
    ]
    # The first round starts every device actor; in the second a new DSSRA plan often moves the blocks onto a
    # device that held none yet, whose first segment costs seconds on a smoke run (0.03-0.12 s per later move in
    # the trained campaign's rounds). Rounds from the third on are the steady state.
    steady = [r["measured_s"]["round_s"] for r in trained[2:]]
    if not steady:
        raise SystemExit(f"error: the {device} smoke run recorded {len(trained)} timed rounds; --round-rounds >= 3")
    later = [r["measured_s"]["round_s"] for r in trained[1:]]
    return {
        "round_first": trained[0]["measured_s"]["round_s"],
        "round_later": sum(later) / len(later),
        "round": sum(steady) / len(steady),
        "step": statistics.median(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overrides", default="task=translation model=transformer_small")
    parser.add_argument(
        "--also",
        action="append",
        default=None,
        help="NAME=OVERRIDES, another server module to time (repeatable)",
    )
    parser.add_argument("--cpu-threads", type=int, default=2, help="torch threads for the CPU side")
    parser.add_argument("--steps", type=int, default=3, help="timed decoder steps per device (after one warm-up)")
    parser.add_argument("--round", action="store_true", help="also time whole smoke federated rounds per device")
    parser.add_argument("--round-only", action="store_true", help="time the rounds alone (no module rows)")
    parser.add_argument("--round-steps", type=int, default=20, help="local steps per CU and round (with --round)")
    parser.add_argument("--round-rounds", type=int, default=4, help="rounds per run (--round; at least 3)")
    args = parser.parse_args()
    has_cuda = torch.cuda.is_available()
    print(f"cuda_available: {int(has_cuda)}")
    if not has_cuda:
        print("# no CUDA GPU visible: the GPU figures are not measured on this machine", file=sys.stderr)
        return
    torch.set_num_threads(args.cpu_threads)
    also = args.also or [
        "paper_decoder_step=task=translation model=transformer_paper",
        "bert_head_step=task=classification model=bert_base",
    ]
    modules = [] if args.round_only else [("decoder_step", args.overrides)] + [tuple(i.split("=", 1)) for i in also]
    for name, overrides in modules:
        cpu = decoder_step_ms(overrides.split(), "cpu", args.steps)
        gpu = decoder_step_ms(overrides.split(), "cuda", max(args.steps, 10))
        print(f"{name}_cpu_ms: {cpu:.2f}")
        print(f"{name}_gpu_ms: {gpu:.3f}")
        print(f"{name}_gpu_speedup: {cpu / gpu:.2f}")
    if args.round or args.round_only:
        with tempfile.TemporaryDirectory(prefix="cp-gpu-") as tmp:
            on_cpu = round_figures("cpu", Path(tmp), args.round_steps, args.round_rounds)
            on_gpu = round_figures("cuda", Path(tmp), args.round_steps, args.round_rounds)
        for name in ("round_first", "round_later"):
            print(f"{name}_cpu_s: {on_cpu[name]:.2f}")
            print(f"{name}_gpu_s: {on_gpu[name]:.2f}")
        for name in ("round", "step"):
            print(f"{name}_cpu_s: {on_cpu[name]:.3f}")
            print(f"{name}_gpu_s: {on_gpu[name]:.3f}")
            print(f"{name}_gpu_speedup: {on_cpu[name] / on_gpu[name]:.2f}")


if __name__ == "__main__":
    main()
