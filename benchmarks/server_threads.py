"""The server's decoder step on 1 or 2 torch threads beside a device stage that Ray runs at nice 15, as in a
simulation where the server and the devices share the machine (``runtime.server_threads``).

Two processes run at once for ``--seconds`` each time: the translation task's default head (transformer_small's
decoder, generator and Adam step on a 64 x 18 batch, bf16 where native) stepping as fast as it can on ``t``
threads, and the encoder's three blocks stepping forward and backward on one thread at nice 15 (Ray's niceness
for its workers). Prints ``name: value`` lines:

* ``head_steps_per_s_threads{t}`` and ``encoder_steps_per_s_beside_threads{t}`` for t = 1, 2;
* ``head_speedup_2_over_1``: what the second thread gains the head;
* ``encoder_share_2_over_1``: what is left of the stage's speed when the head takes two threads.

    python benchmarks/server_threads.py [--seconds 15]

On the 2-core machine of issue 43 (nothing else running, two runs): the head 1.26-1.34x faster on 2 threads, the stage
at 5-9% of its speed beside it, which is why the server computes on one thread while rounds train.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
B, T, T_TGT, VOCAB = 64, 18, 19, 5000


def build():
    import torch

    from collapipe_flwr.models.transformer import TransformerConfig, build_transformer

    sizes = dict(src_vocab=VOCAB, tgt_vocab=VOCAB, d_model=256, n_heads=4, d_ff=512, enc_layers=3, dec_layers=2)
    config = TransformerConfig(**sizes, dropout=0.1, max_len=128, pad_id=0, label_smoothing=0.1, tie_embeddings=True)
    torch.manual_seed(0)
    return build_transformer(config)


def head_loop(threads: int, seconds: float) -> float:
    """Head steps per second on ``threads`` torch threads."""
    import torch

    from collapipe_flwr.pipeline.head import LocalHead
    from collapipe_flwr.pipeline.optim import OptimizerSpec
    from collapipe_flwr.precision import resolve_precision

    torch.set_num_threads(threads)
    model = build()
    head = LocalHead(model.head, OptimizerSpec("adam", 1e-4), resolve_precision("auto"))
    z = torch.randn(B, T, 256)
    batch = {
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "decoder_input_ids": torch.randint(1, VOCAB, (B, T_TGT)),
        "labels": torch.randint(1, VOCAB, (B, T_TGT)),
    }
    head([z], [batch])
    return _rate(lambda: head([z], [batch]), seconds)


def encoder_loop(seconds: float) -> float:
    """Encoder (3 blocks) forward + backward steps per second on one thread."""
    import torch

    from collapipe_flwr.precision import autocast, resolve_precision

    torch.set_num_threads(1)
    model = build()
    precision = resolve_precision("auto")
    x = torch.randn(B, T, 256, requires_grad=True)
    mask = torch.ones(B, T, dtype=torch.long)

    def step() -> None:
        with autocast(precision, "cpu"):
            hidden = x
            for block in model.blocks:
                hidden = block(hidden, mask)
        hidden.float().sum().backward()

    step()
    return _rate(step, seconds)


def _rate(step, seconds: float) -> float:
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return count / (time.perf_counter() - start)


def _child(args: list[str], niceness: int = 0) -> subprocess.Popen:
    def lower() -> None:
        os.nice(niceness)

    return subprocess.Popen(
        [sys.executable, __file__, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lower if niceness else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--role", choices=["head", "encoder"], help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "head":
        print(head_loop(args.threads, args.seconds))
        return
    if args.role == "encoder":
        print(encoder_loop(args.seconds))
        return
    print(f"load_avg_1min: {os.getloadavg()[0]:.2f}")
    rates = {}
    for threads in (1, 2):
        head = _child(["--role", "head", "--threads", str(threads), "--seconds", str(args.seconds)])
        encoder = _child(["--role", "encoder", "--seconds", str(args.seconds)], niceness=15)
        head_out, _ = head.communicate(timeout=args.seconds * 10 + 120)
        encoder_out, _ = encoder.communicate(timeout=args.seconds * 10 + 120)
        if head.returncode or encoder.returncode:
            raise SystemExit(f"a benchmark process failed (head exit {head.returncode}, encoder {encoder.returncode})")
        rates[threads] = (float(head_out.split()[-1]), float(encoder_out.split()[-1]))
        print(f"head_steps_per_s_threads{threads}: {rates[threads][0]:.2f}")
        print(f"encoder_steps_per_s_beside_threads{threads}: {rates[threads][1]:.2f}")
    print(f"head_speedup_2_over_1: {rates[2][0] / rates[1][0]:.3f}")
    print(f"encoder_share_2_over_1: {rates[2][1] / rates[1][1]:.3f}")
    print(f"load_avg_1min_after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
