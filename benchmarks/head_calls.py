"""The server's head step with a GPipe step's micro-batches stacked into one call, against one call each.

``pipeline.head.head_step`` runs the head once per run of stackable micro-batches (the m slices of one padded
batch), where it ran it once per micro-batch; the virtual clock's decoder term was then linear in m (each call pays
the head's fixed cost: the CRF's loop over the positions, a decoder's kernel launches;
results/virtual_paper/table.md, "The server's decoder term ... by the plan's m"). This times both ways on the same
head and inputs, alternating step by step in one process: the stacked call (``head_step``) and one call per
micro-batch (``head_step(..., breaks=range(1, m))``, the former behaviour). It prints per m the median CPU
seconds of each (``time.thread_time``) and ``ratio_one_call_each_over_stacked_m{m}``.

Heads: ``ner`` (bert_small's hidden 256, the CRF head, People's Daily's 9 tags, B = 64, T = 160: conf/task/ner.yaml)
and ``translation`` (transformer_small's decoder: 2 blocks, d_model 256, FFN 512, over z_enc [B, T, 256] with
T_tgt = T, a target vocabulary of ``--tgt-vocab``, 8000 by default; give ``--seq-len 40``; the campaign's Multi30K
decoder: ``--seq-len 24 --tgt-vocab 5000``). ``--precision``: ``auto`` (the config's default: bf16 where the CPU has
it natively, as the server resolves it), ``fp32`` or ``bf16``; the step runs under the server's autocast. One thread,
as the server's decoder runs. Run: ``python benchmarks/head_calls.py --head ner --micro-batches 1 16 32 --steps 5``
(about a minute on 2 cores).
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
from collapipe_flwr.models.transformer import TransformerConfig, build_transformer  # noqa: E402
from collapipe_flwr.pipeline.head import head_step  # noqa: E402
from collapipe_flwr.pipeline.optim import OptimizerSpec  # noqa: E402
from collapipe_flwr.precision import autocast, resolve_precision  # noqa: E402


def server_head(name: str, hidden: int, tgt_vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "ner":
        config = BertSplitConfig(
            vocab_size=100, hidden=hidden, n_heads=4, d_ff=4 * hidden, layers=1, dropout=0.1, max_len=512,
            head="token_crf", num_labels=9,
        )  # fmt: skip
        return build_bert(config).head
    sizes = dict(
        src_vocab=100, tgt_vocab=tgt_vocab, d_model=hidden, n_heads=4, d_ff=2 * hidden, enc_layers=1, dec_layers=2
    )
    return build_transformer(TransformerConfig(**sizes, dropout=0.1, max_len=512, pad_id=0)).head


def batch(name: str, rows: int, T: int, hidden: int, tgt_vocab: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(T // 4, T + 1, (rows,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    z = torch.randn(rows, T, hidden, generator=g)
    if name == "ner":
        labels = torch.randint(0, 9, (rows, T), generator=g).masked_fill(mask == 0, -100)
        return z, {"attention_mask": mask, "labels": labels}
    tgt = torch.randint(3, tgt_vocab, (rows, T), generator=g) * mask
    return z, {"attention_mask": mask, "decoder_input_ids": tgt, "labels": tgt.masked_fill(mask == 0, -100)}


def split(z: torch.Tensor, mb: dict[str, torch.Tensor], m: int) -> tuple[list, list]:
    zs = list(z.chunk(m))
    return zs, [dict(zip(mb, parts)) for parts in zip(*(v.chunk(m) for v in mb.values()))]


def main() -> None:
    args = command_line.parse(
        __doc__ or "",
        head="ner",
        batch=64,
        seq_len=160,
        hidden=256,
        steps=5,
        micro_batches=[1, 16, 32],
        tgt_vocab=8000,
        precision="auto",
    )
    torch.set_num_threads(1)
    precision = resolve_precision(args.precision)
    print(f"precision: {precision}")
    head = server_head(args.head, args.hidden, args.tgt_vocab)
    optimizer = OptimizerSpec(name="adam", lr=1e-4).build(head.parameters())
    z, mb = batch(args.head, args.batch, args.seq_len, args.hidden, args.tgt_vocab)
    for m in args.micro_batches:
        zs, mbs = split(z, mb, m)
        ways = {"stacked": (), "one_call_each": range(1, len(zs))}
        seconds: dict[str, list[float]] = {w: [] for w in ways}
        for step in range(args.steps + 1):  # step 0 warms up, not counted
            for way, breaks in ways.items():
                start = time.thread_time()
                with autocast(precision):
                    head_step(head, optimizer, zs, mbs, breaks=breaks)
                if step:
                    seconds[way].append(time.thread_time() - start)
        med = {w: statistics.median(s) for w, s in seconds.items()}
        for way in ways:
            print(f"{way}_cpu_s_m{m}: {med[way]:.4f}")
        print(f"ratio_one_call_each_over_stacked_m{m}: {med['one_call_each'] / med['stacked']:.2f}")


if __name__ == "__main__":
    main()
