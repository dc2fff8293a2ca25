"""The independent reference of the split/federated tests: the whole model trained in one process."""

from __future__ import annotations

import copy
import itertools

import torch

from collapipe_flwr import wiring
from collapipe_flwr.tasks.lr_schedule import lr_factor


def plain_losses(cfg, task, indices, rounds: int = 1) -> list[float]:
    """The whole model in one process, one optimizer over all parameters for the whole run, loss = sum / count,
    model.lr_schedule over T * local_steps steps (as train_central applies it), each round's batches in
    cluster 0's order (wiring.round_seed)."""
    torch.manual_seed(cfg.seed)
    model = wiring.build_model(task, cfg)
    params = [*model.embedding.parameters(), *model.blocks.parameters(), *model.head.parameters()]
    opt = wiring.optimizer_spec(cfg).build(params)
    base = opt.param_groups[0]["lr"]
    lr_schedule = cfg.model.lr_schedule
    total = cfg.federation.num_rounds * cfg.federation.local_steps
    losses, step = [], 0
    for t in range(1, rounds + 1):
        batches = wiring.partition_batches(task, cfg, indices, seed=wiring.round_seed(cfg, t, 0))
        for batch in itertools.islice(batches, cfg.federation.local_steps):
            opt.param_groups[0]["lr"] = base * lr_factor(
                step, lr_schedule.warmup_steps, lr_schedule.decay, total, lr_schedule.min_factor
            )
            opt.zero_grad()
            loss_sum, count = model.loss_terms(batch)
            loss = loss_sum / count
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
    return losses


def plain_steps(model, batches, spec):
    """The un-split ``model`` (a copy) trained on ``batches`` in turn: one optimizer of ``spec`` per part, loss = sum /
    count over the whole batch. (the trained copy, each step's loss)."""
    model = copy.deepcopy(model).train()
    opts = [spec.build(p.parameters()) for p in model.parts()]
    losses = []
    for data in batches:
        for o in opts:
            o.zero_grad()
        s, c = model.loss_terms(data)
        (s / c).backward()
        for o in opts:
            o.step()
        losses.append(float((s / c).detach()))
    return model, losses
