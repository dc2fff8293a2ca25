"""The benchmark's model (BERT-small with a token-classification head, Adam) and the plain one-process reference
it is timed against."""

from __future__ import annotations

import statistics
import time

import torch

from collapipe_flwr.models.bert import BertSplitConfig, build_bert
from collapipe_flwr.pipeline.memory import SavedTensorMeter, optimizer_state_bytes, param_bytes
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.sparse_embedding import densify_gradients, use_sparse_gradients

VOCAB, HIDDEN, HEADS, FFN, LAYERS, LABELS = 21128, 256, 4, 1024, 6, 7
DELTAS = {1: (6,), 2: (3, 3), 3: (2, 2, 2)}
SPEC = OptimizerSpec(name="adam", lr=1e-4)


def make_model():
    torch.manual_seed(0)
    return build_bert(BertSplitConfig(VOCAB, HIDDEN, HEADS, FFN, LAYERS, 0.1, 128, "token", LABELS))


def make_batch(b: int, t: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(1, VOCAB, (b, t), generator=g),
        "attention_mask": torch.ones(b, t, dtype=torch.long),
        "labels": torch.randint(0, LABELS, (b, t), generator=g),
    }


def plain_model_figures(batch, warmup: int, steps: int, threads: int) -> tuple[float, int, int]:
    """(median step seconds, peak bytes of the whole model, peak bytes of the encoder alone).

    Saved-tensor hooks do not nest (the innermost wins), so embedding, encoder and head are metered one
    after the other and summed."""
    torch.set_num_threads(threads)
    model = make_model().train()
    use_sparse_gradients(model.embedding)  # as the CU's embedding (PlainTrainer)
    optimizers = [SPEC.build(part.parameters()) for part in model.parts()]
    params = list(model.parameters())
    times, peak_all, peak_enc = [], 0, 0
    for i in range(warmup + steps):
        start = time.perf_counter()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        with SavedTensorMeter(exclude=params) as emb_meter:
            hidden = model.embedding(batch["input_ids"])
        with SavedTensorMeter(exclude=params) as enc_meter:
            for block in model.blocks:
                hidden = block(hidden, batch["attention_mask"])
        with SavedTensorMeter(exclude=params) as head_meter:
            loss_sum, count = model.head.loss_terms(hidden, batch["attention_mask"], batch)
        (loss_sum / count).backward()
        densify_gradients(model.embedding)
        for opt in optimizers:
            opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        peak_all = max(peak_all, emb_meter.bytes + enc_meter.bytes + head_meter.bytes)
        peak_enc = max(peak_enc, enc_meter.bytes)
    static_all = param_bytes(list(model.parts())) + sum(optimizer_state_bytes(o) for o in optimizers)
    static_enc = param_bytes(model.blocks) + optimizer_state_bytes(optimizers[1])
    return statistics.median(times), static_all + peak_all, static_enc + peak_enc


class PlainTrainer:
    """The whole model in this process, one optimizer per part (element-wise, so the same as one). Its token
    embedding takes row-sparse gradients, densified before the update, as the CU's does
    (``pipeline/sparse_embedding.py``), so the framework's overhead is not flattered by an optimisation the
    reference lacks."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.model = make_model().train()
        use_sparse_gradients(self.model.embedding)
        self.optimizers = [SPEC.build(part.parameters()) for part in self.model.parts()]

    def step(self, batch) -> float:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        loss_sum, count = self.model.loss_terms(batch)
        (loss_sum / count).backward()
        densify_gradients(self.model.embedding)
        for opt in self.optimizers:
            opt.step()
        seconds = time.perf_counter() - start
        torch.set_num_threads(previous)
        return seconds
