"""A Hugging Face model of GPT-2 small's shape through the shipped pipeline: per-device memory and step time.

The model: ``GPT2LMHeadModel`` built from a ``GPT2Config`` with GPT-2 small's shape (L = 12 TEBs, H = 768,
h = 12 heads, vocabulary 50257, 1024 positions; ~124M parameters, random weights, nothing downloaded, dropout
0), cut by ``split_hf_model`` into the CU's embedding, the L TEBs and the server's ln_f + LM head (the tied
embedding untied into a second copy, ``models/hf/tying.py``), trained through ``ClusterPipeline`` (local
backend, fp32, GPipe, AdamW) on one batch of b = 4 x 128 random tokens. Prints ``name: value`` lines:

- per (S, LoRA) for S = 1, 2, 4 segments of balanced delta_k, m = S micro-batches, without LoRA (``full``) and
  with LoRA (r = 8, alpha 16 on every TEB's c_attn / c_proj, ``apply_lora``; base weights frozen):
  ``peak_mib_S{S}_{full|lora}`` the largest over devices k of gamma_k = params + gradients + optimizer state +
  peak saved activations after one step (``memory_report``'s params, AdamW state and ``SavedTensorMeter``
  activations, plus the gradients, which equal the segment's trainable bytes at their peak and are freed by
  the step), and its parts ``{params,grads,optim,act}_mib_S{S}_{full|lora}`` on that device;
- ``plain_peak_mib_{full|lora}``: the same count for the un-split model on one device (params, gradients,
  AdamW state, saved activations of the whole forward), for scale;
- ``step_ratio_split_vs_hf_S1_m1`` / ``_S2_m2``: the median step seconds of the split model through the
  pipeline (S = 1, m = 1 and S = 2, m = 2, full fine-tuning) over the median of the un-split HF model doing
  the same step (forward with labels, backward, AdamW) in this process, the two alternating step by step so
  both see the same background load (``--warmup`` steps first, then ``--steps``), and both medians in seconds.

Peak host memory about 7 GB (the un-split model and one split alive at once). Run:
``python benchmarks/hf_pipeline_memory.py [--steps 3] [--warmup 1]`` (21 training steps; 14 minutes on 2 cores
shared at load 12-16, ~30 s a step; far less on idle cores).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import command_line  # noqa: E402  (benchmarks/, beside this script)

from collapipe_flwr.models.hf import apply_lora, load_hf_model, lora_config, split_hf_model  # noqa: E402
from collapipe_flwr.models.hf.lora import trainable_bytes  # noqa: E402
from collapipe_flwr.models.split import segment_bounds  # noqa: E402
from collapipe_flwr.pipeline.cluster import ClusterPipeline  # noqa: E402
from collapipe_flwr.pipeline.head import LocalHead  # noqa: E402
from collapipe_flwr.pipeline.memory import SavedTensorMeter, optimizer_state_bytes, param_bytes  # noqa: E402
from collapipe_flwr.pipeline.optim import OptimizerSpec  # noqa: E402

LAYERS, HIDDEN, HEADS, VOCAB = 12, 768, 12, 50257
SPEC = OptimizerSpec(name="adamw", lr=1e-4, weight_decay=0.0)
MIB = 2.0**20


def make_model():
    """GPT-2 small's shape, random weights (seed 0), dropout 0."""
    config = GPT2Config(
        n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, vocab_size=VOCAB, n_positions=1024,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return load_hf_model(config, "causal_lm").train()


def make_batch(b: int, t: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def balanced(S: int) -> list[int]:
    """delta = (delta_1..delta_S), L blocks as even as they go."""
    return [LAYERS // S + (1 if s < LAYERS % S else 0) for s in range(S)]


class Split:
    """A fresh model (LoRA r = 8 optionally) split into a ``ClusterPipeline`` of S balanced segments."""

    def __init__(self, S: int, lora: bool) -> None:
        split = split_hf_model(make_model())
        if lora:
            apply_lora(split, lora_config("gpt2", r=8, alpha=16))
        self.delta = balanced(S)
        self.grad_bytes = [trainable_bytes(split.blocks[a:b]) for _, a, b in segment_bounds(self.delta)]
        self.head = LocalHead(split.head, SPEC)
        self.pipe = ClusterPipeline(split.embedding, split.blocks, self.delta, SPEC)  # copies the blocks

    def step(self, batch, m: int) -> float:
        return self.pipe.train_step(batch, m, self.head).timings.total

    def peak(self) -> dict[str, float]:
        """The device with the largest gamma_k = params + grads + optimizer state + peak activations, in MiB."""
        rows = [
            {
                "params": r["param_bytes"], "grads": g, "optim": r["optimizer_bytes"],
                "act": r["peak_activation_bytes"], "peak": r["peak_bytes"] + g,
            }
            for r, g in zip(self.pipe.memory_report(), self.grad_bytes)
        ]  # fmt: skip
        top = max(rows, key=lambda r: r["peak"])
        return {k: v / MIB for k, v in top.items()}

    def close(self) -> None:
        self.pipe.shutdown()


class Plain:
    """The un-split HF model in this process (the same weights as a :class:`Split`'s), AdamW over what trains."""

    def __init__(self, lora: bool = False) -> None:
        self.model = make_model()
        if lora:
            from peft import inject_adapter_in_model

            for p in self.model.parameters():
                p.requires_grad_(False)
            inject_adapter_in_model(lora_config("gpt2", r=8, alpha=16), self.model.transformer.h)
        self.optimizer = SPEC.build(self.model.parameters())
        self.act_bytes = 0

    def step(self, batch, meter: bool = False) -> float:
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        if meter:
            with SavedTensorMeter(exclude=self.model.parameters()) as saved:
                loss = self.model(**batch).loss
            self.act_bytes = max(self.act_bytes, saved.bytes)
        else:
            loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        return time.perf_counter() - start

    def peak_mib(self) -> float:
        static = param_bytes(self.model) + trainable_bytes(self.model) + optimizer_state_bytes(self.optimizer)
        return (static + self.act_bytes) / MIB


def timed_ratio(plain: Plain, batch, S: int, warmup: int, steps: int) -> tuple[float, float, dict]:
    """(median split step s, median plain step s, the split's peak) with S = m, the two alternating."""
    split = Split(S, lora=False)
    piped, direct = [], []
    for i in range(warmup + steps):
        split_s = split.step(batch, S)
        plain_s = plain.step(batch)
        if i >= warmup:
            piped.append(split_s)
            direct.append(plain_s)
    peak = split.peak()
    split.close()
    del split
    gc.collect()
    return statistics.median(piped), statistics.median(direct), peak


def report_peak(S: int, name: str, peak: dict[str, float]) -> None:
    print(f"peak_mib_S{S}_{name}: {peak['peak']:.1f}")
    for part in ("params", "grads", "optim", "act"):
        print(f"{part}_mib_S{S}_{name}: {peak[part]:.1f}")


def main() -> None:
    args = command_line.parse(__doc__ or "", batch=4, seq_len=128, warmup=1, steps=3)
    print(f"load_avg_1min: {os.getloadavg()[0]:.2f}")
    print(f"torch_threads: {torch.get_num_threads()}")
    batch = make_batch(args.batch, args.seq_len)
    plain = Plain()
    print(f"params_M: {sum(p.numel() for p in plain.model.parameters()) / 1e6:.1f}")
    plain.step(batch, meter=True)  # its activations, and a warm-up
    print(f"plain_peak_mib_full: {plain.peak_mib():.1f}")
    for S in (1, 2):
        split_s, plain_s, peak = timed_ratio(plain, batch, S, args.warmup, args.steps)
        print(f"split_step_s_S{S}_m{S}: {split_s:.3f}")
        print(f"hf_step_s_S{S}_m{S}: {plain_s:.3f}")
        print(f"step_ratio_split_vs_hf_S{S}_m{S}: {split_s / plain_s:.3f}")
        report_peak(S, "full", peak)
    del plain
    gc.collect()
    lora_plain = Plain(lora=True)
    lora_plain.step(batch, meter=True)
    print(f"plain_peak_mib_lora: {lora_plain.peak_mib():.1f}")
    del lora_plain
    for S, lora in ((4, False), (1, True), (2, True), (4, True)):
        split = Split(S, lora)
        split.step(batch, S)
        report_peak(S, "lora" if lora else "full", split.peak())
        split.close()
        del split
        gc.collect()
    print(f"load_avg_1min_end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
