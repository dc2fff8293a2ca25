"""Peak activation memory per stage: GPipe vs 1F1B, measured on hand-driven stages and on the shipped pipeline.

With ``pipeline.schedule: gpipe`` the head (the server's decoder) takes z_enc of the WHOLE batch in one
data-plane call per step. Then every forward must be done on every stage before any backward can start, so
each stage holds all m micro-batches' activations when the head runs, whatever order its backwards come in:
1F1B's saving (stage k keeps min(m, S - k) micro-batches alive instead of m) needs one head call per
micro-batch, which ``pipeline.schedule: 1f1b`` does (``pipeline/one_f_one_b.py``). This script measures three
orders on the same stages (``pipeline.stage.Stage`` objects in this process, ``SavedTensorMeter`` bytes),
BERT-small 32 x 64 tokens, token head, Adam:

- ``gpipe``: forward in GPipe's clock cycles, one head call on the whole batch, backward mirrored
  (what ``ClusterPipeline.train_step`` does);
- ``1f1b_head_once``: the same single head call, then each stage's backwards in 1F1B's ascending order;
- ``1f1b``: true 1F1B with one head call per micro-batch (stage k: min(S - k - 1, m) warm-up forwards,
  then one forward / one backward, then the cool-down backwards), each micro-batch's loss divided by
  the whole batch's target count C, so the gradients equal GPipe's (checked: ``max_grad_diff``).

and the shipped ``ClusterPipeline`` (local backend) in both schedules: ``shipped_act_ratio_1f1b_vs_gpipe_S*_m*``,
the largest over stages of the stage's peak activation bytes under 1F1B / under GPipe (its memory report), and
``shipped_max_grad_rel_diff_1f1b_S*_m*``, the largest relative difference of a stage's or the head's gradient.

Prints ``name: value`` lines: per (S, m) and order the largest per-stage peak activation MiB, the
per-stage peak total (params + Adam state + activations) as a ratio to GPipe's, and the gradient checks.

Run: ``python benchmarks/pipeline_1f1b_memory.py [--S 2 3] [--m 4 8]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dataclasses  # noqa: E402

from collapipe_flwr.models.split import segment_bounds  # noqa: E402
from collapipe_flwr.pipeline.cluster import ClusterPipeline  # noqa: E402
from collapipe_flwr.pipeline.head import LocalHead  # noqa: E402
from collapipe_flwr.pipeline.memory import optimizer_state_bytes, param_bytes  # noqa: E402
from collapipe_flwr.pipeline.microbatch import split_batch  # noqa: E402
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME  # noqa: E402
from collapipe_flwr.pipeline.schedule import backward_cycles, forward_cycles  # noqa: E402
from collapipe_flwr.pipeline.stage import Stage  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead.model import FFN, HEADS, HIDDEN, LABELS, LAYERS, SPEC, VOCAB, make_batch  # noqa: E402

from collapipe_flwr.models.bert import BertSplitConfig, build_bert  # noqa: E402

ORDERS = ("gpipe", "1f1b_head_once", "1f1b")


def one_f_one_b(k: int, S: int, m: int) -> list[tuple[str, int]]:
    """Stage k's calls in 1F1B order: warm-up forwards, then alternating F/B, then cool-down backwards."""
    warm = min(S - k - 1, m)
    ops = [("F", i) for i in range(warm)]
    for j in range(m - warm):
        ops += [("F", warm + j), ("B", j)]
    return ops + [("B", i) for i in range(m - warm, m)]


class Run:
    """S stages over one model copy, an embedding and head in this process, driven in one order."""

    def __init__(self, model, S: int, batch, m: int) -> None:
        self.model = copy.deepcopy(model).train()
        delta = [LAYERS // S + (1 if s < LAYERS % S else 0) for s in range(S)]
        self.stages = [
            Stage(k, copy.deepcopy(torch.nn.ModuleList(self.model.blocks[a:b])), SPEC)
            for k, a, b in segment_bounds(delta)
        ]
        self.S, self.m = S, m
        self.micro = split_batch(batch, m)
        self.total = float(sum(int((mb["labels"] != -100).sum()) for mb in self.micro))  # C, the whole batch
        for st in self.stages:
            st.begin_step()
        self.embedded: dict[int, torch.Tensor] = {}
        self.out: dict[tuple[int, int], torch.Tensor] = {}
        self.grad: dict[tuple[int, int], torch.Tensor] = {}

    def forward(self, i: int, k: int) -> None:
        if k == 0:
            self.embedded[i] = self.model.embedding(self.micro[i]["input_ids"])
            x = self.embedded[i].detach()
        else:
            x = self.out[(i, k - 1)]
        self.out[(i, k)] = self.stages[k].forward(i, x, self.micro[i]["attention_mask"])

    def head(self, i: int) -> None:
        """dL/dz_enc for micro-batch i: its loss SUM over the whole batch's target count C."""
        z = self.out[(i, self.S - 1)].detach().requires_grad_(True)
        loss_sum, _ = self.model.head.loss_terms(z, self.micro[i]["attention_mask"], self.micro[i])
        (loss_sum / self.total).backward()
        self.grad[(i, self.S)] = z.grad

    def backward(self, i: int, k: int) -> None:
        self.grad[(i, k)] = self.stages[k].backward(i, self.grad[(i, k + 1)])
        if k == 0:
            self.embedded[i].backward(self.grad[(i, 0)])

    def drive(self, order: str) -> None:
        S, m = self.S, self.m
        if order != "1f1b":
            for cycle in forward_cycles(m, S):
                for i, k in cycle:
                    self.forward(i, k)
            for i in range(m):
                self.head(i)  # one head call on the whole batch = these m together, before any backward
            if order == "gpipe":
                for cycle in backward_cycles(m, S):
                    for i, k in cycle:
                        self.backward(i, k)
            else:
                for i in range(m):
                    for k in reversed(range(S)):
                        self.backward(i, k)
            return
        queues = [one_f_one_b(k, S, m) for k in range(S)]
        done: set[tuple[str, int, int]] = set()
        while any(queues):  # any stage whose next call has its input ready runs it (a valid 1F1B execution)
            for k in range(S):
                if not queues[k]:
                    continue
                kind, i = queues[k][0]
                if kind == "F" and (k == 0 or ("F", i, k - 1) in done):
                    self.forward(i, k)
                    if k == S - 1:
                        self.head(i)
                elif kind == "B" and (k == S - 1 or ("B", i, k + 1) in done):
                    self.backward(i, k)
                else:
                    continue
                done.add((kind, i, k))
                queues[k].pop(0)

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for st in self.stages for p in st.segment.parameters()] + [
            p.grad for p in self.model.embedding.parameters()
        ]

    def peaks(self) -> list[tuple[int, int]]:
        """Per stage: (peak activation bytes, params + Adam state bytes after one step)."""
        out = []
        for st in self.stages:
            st.step()
            out.append((st.peak_activation_bytes, param_bytes(st.segment) + optimizer_state_bytes(st.optimizer)))
        return out


def shipped(model, batch, S: int, m: int, schedule: str) -> tuple[list[int], list[torch.Tensor]]:
    """One step of the shipped ClusterPipeline in ``schedule`` (local backend): per stage its peak activation
    bytes, and the gradients of every stage's parameters (read just before each stage's update) and the head's."""
    work = copy.deepcopy(model).train()
    delta = [LAYERS // S + (1 if s < LAYERS % S else 0) for s in range(S)]
    head = LocalHead(work.head, SPEC)
    runtime = dataclasses.replace(LOCAL_RUNTIME, schedule=schedule)
    with ClusterPipeline(work.embedding, work.blocks, delta, SPEC, runtime=runtime) as pipe:
        grads: list[torch.Tensor] = []
        for stage in pipe.stages.stages:  # type: ignore[attr-defined]  # LocalStages: the Stage objects

            def step(lr_factor: float = 1.0, stage=stage, update=stage.step) -> float:
                grads.extend(p.grad.detach().clone() for p in stage.segment.parameters())
                return update(lr_factor)

            stage.step = step
        pipe.train_step(batch, m, head)
        peaks = [int(r["peak_activation_bytes"]) for r in pipe.memory_report()]
    return peaks, grads + [p.grad.detach().clone() for p in work.head.parameters()]


def report_shipped(model, batch, S: int, m: int) -> None:
    """The shipped schedules' figures for (S, m)."""
    gp_peaks, gp_grads = shipped(model, batch, S, m, "gpipe")
    peaks, grads = shipped(model, batch, S, m, "1f1b")
    ratio = max(p / max(g, 1) for p, g in zip(peaks, gp_peaks))
    diff = max(float((a - b).abs().max()) / max(1e-30, float(b.abs().max())) for a, b in zip(grads, gp_grads))
    print(f"shipped_act_ratio_1f1b_vs_gpipe_S{S}_m{m}: {ratio:.3f}")
    print(f"shipped_max_grad_rel_diff_1f1b_S{S}_m{m}: {diff:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--S", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--m", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # dropout 0: the orders draw dropout masks in different sequences, which would hide the gradient check
    model = build_bert(BertSplitConfig(VOCAB, HIDDEN, HEADS, FFN, LAYERS, 0.0, 128, "token", LABELS))
    batch = make_batch(args.batch, args.seq_len)
    for S in args.S:
        for m in args.m:
            runs = {}
            for order in ORDERS:
                run = Run(model, S, batch, m)
                run.drive(order)
                runs[order] = run
            for order in ("1f1b_head_once", "1f1b"):  # before peaks(): each stage's step zeroes its gradients
                diff = max(
                    float((a - b).abs().max()) / max(1e-30, float(b.abs().max()))
                    for a, b in zip(runs[order].grads(), runs["gpipe"].grads())
                )
                print(f"max_grad_rel_diff_{order}_S{S}_m{m}: {diff:.2e}")
            gpipe = runs["gpipe"].peaks()
            for order, run in runs.items():
                peaks = gpipe if order == "gpipe" else run.peaks()
                for k, (act, _static) in enumerate(peaks):
                    print(f"act_mib_{order}_S{S}_m{m}_stage{k}: {act / 2**20:.2f}")
                if order != "gpipe":
                    worst = max(a + s for a, s in peaks) / max(a + s for a, s in gpipe)
                    print(f"peak_ratio_{order}_vs_gpipe_S{S}_m{m}: {worst:.3f}")
            report_shipped(model, batch, S, m)


if __name__ == "__main__":
    main()
