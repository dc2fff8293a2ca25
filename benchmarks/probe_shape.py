"""Does the virtual clock's host probe follow the speed of the calls it scales, over time (issue 63)?

The clock sets every device call's CPU seconds against the host's speed, which the server reads at start-up and,
with ``clock.probe_every_round``, at each round's start (``pipeline.profiling.host_flop_rate``: one thread, one
TEB's forward + backward on ``PROBE_EXAMPLES`` = 8 examples, at the devices' precision). The devices' calls have
other shapes: a whole batch of 64 at m = 1, two examples at m = 32. If the host's speed for the probe's shape and for
a training shape move together, the ratio of the two rates stays put while each rate drifts, and the probe corrects
the drift. If they do not, the probe adds its own drift to the clock. Two NER jobs run twice with identical plans
read their CPU seconds within 4-8% and their probes 12-43% apart (results/README.md, "What the clock adds between
two jobs").

This alternates the probe's shape and the training shapes in one process, one thread, as ``host_flop_rate`` times
them (at least ``--min-cpu-s`` CPU seconds each), every ``--every-s`` seconds for ``--minutes``, on bert_small's TEB
(hidden 256, 4 heads, FFN 1024, T = 160: conf/model/bert_small.yaml, conf/task/ner.yaml). It prints each sample's
rates (tokens per CPU second), then per training shape ``probe_tracks_<shape>_spread``: the ratio's max / min over
the samples, beside each rate's own max / min (``rate_spread_<shape>``). A ratio spread well under the rates'
spreads means the probe follows that shape.

Run: ``python benchmarks/probe_shape.py --minutes 10`` with nothing else running (``--precision auto``: bf16
where the CPU has it natively, as the campaign's devices ran on the Xeon).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import command_line  # noqa: E402  (benchmarks/, beside this script)

from collapipe_flwr.models.bert import BertSplitConfig, build_bert  # noqa: E402
from collapipe_flwr.pipeline.profiling import host_flop_rate  # noqa: E402
from collapipe_flwr.precision import resolve_precision  # noqa: E402

SHAPES = {"probe": 8, "m1": 64, "m32": 2}  # rows of a call: the probe's examples, a batch of 64 at m = 1 and m = 32


def block(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertSplitConfig(
        vocab_size=100, hidden=hidden, n_heads=4, d_ff=4 * hidden, layers=1, dropout=0.1, max_len=512,
        head="token_crf", num_labels=9,
    )  # fmt: skip
    return build_bert(config).blocks[0]


def spread(values: list[float]) -> float:
    return max(values) / min(values)


def main() -> None:
    args = command_line.parse(
        __doc__ or "", minutes=10.0, every_s=20.0, min_cpu_s=0.3, seq_len=160, hidden=256, precision="auto"
    )
    precision = str(resolve_precision(args.precision))
    teb = block(args.hidden)
    inputs = {
        name: (torch.randn(rows, args.seq_len, args.hidden), torch.ones(rows, args.seq_len, dtype=torch.long))
        for name, rows in SHAPES.items()
    }
    print(f"precision: {precision}; shapes (rows x {args.seq_len}): {SHAPES}", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in SHAPES}
    end = time.monotonic() + 60.0 * args.minutes
    while time.monotonic() < end:
        started = time.monotonic()
        for name, (x, mask) in inputs.items():
            tokens = float(x.shape[0] * x.shape[1])  # the rate in tokens per CPU second: FLOPs per token are alike
            rates[name].append(host_flop_rate(teb, x, mask, tokens, precision, min_cpu_s=args.min_cpu_s))
        print(" ".join(f"{name} {rates[name][-1]:.0f}" for name in SHAPES), flush=True)
        time.sleep(max(0.0, args.every_s - (time.monotonic() - started)))
    for name in SHAPES:
        print(f"rate_spread_{name}: {spread(rates[name]):.3f}")
    for name in (n for n in SHAPES if n != "probe"):
        ratios = [a / b for a, b in zip(rates[name], rates["probe"])]
        print(f"probe_tracks_{name}_spread: {spread(ratios):.3f}")
        print(f"ratio_{name}_over_probe_median: {statistics.median(ratios):.3f}")
    print(f"samples: {len(rates['probe'])}")


if __name__ == "__main__":
    main()
