"""The CU's local steps of one round (Algorithm 1, lines 6-21): ``federation.local_steps`` GPipe steps over this
cluster's partition, each at the learning-rate factor of its run-wide step (``tasks.lr_schedule.LrClock``).

Each step: the CU embeds, the devices run their segments over m micro-batches, the head (the server's decoder
over the data plane, or a CU-side head) returns dL/dz_enc, the devices and the embedding step
(``pipeline.cluster.ClusterPipeline.train_step``). With D > 1 data users in the plan (VanillaFL read the paper's
way), each user runs the steps on its share of every batch and the users are averaged
(``fl/cu/data_parallel.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from collapipe_flwr import wiring
from collapipe_flwr.config import ClusterConfig
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.cu import data_parallel
from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.dropout_seed import step_seed
from collapipe_flwr.pipeline.head import HeadFn, LocalHead
from collapipe_flwr.tasks.base import Task

Batch = dict[str, torch.Tensor]
Select = Callable[[Batch], "Batch | None"]


def round_batches(task: Task, cfg: ClusterConfig, examples: list[int], round_: int, cluster: int):
    """Round t's batches for cluster n: its partition shuffled with the round's seed, epoch after epoch, without
    end (the caller takes ``federation.local_steps`` of them)."""
    seed = wiring.round_seed(cfg, round_, cluster)
    return wiring.partition_batches(task, cfg, examples, seed=seed)


def run_steps(
    pipeline: ClusterPipeline,
    head: HeadFn,
    batches,
    m: int,
    lr_factor_of: Callable[[int], float],
    num_devices: int,
    select: Select | None = None,
    step_seed_of: Callable[[int], int | None] = lambda i: None,
) -> StepLog:
    """One GPipe step per batch of ``batches`` with m micro-batches at ``lr_factor_of(i)`` for the i-th step;
    ``select`` (a data user's share) maps a batch to the rows to train on (None: that user skips the batch);
    ``step_seed_of(i)``: the i-th step's dropout seed (None: unseeded, ``runtime.seeded_dropout: false``)."""
    log = StepLog.empty(num_devices)
    for i, batch in enumerate(batches):
        rows = select(batch) if select is not None else batch
        if rows is None:  # this data user's share of a short batch is empty
            continue
        result = pipeline.train_step(rows, m, head, lr_factor=lr_factor_of(i), step_seed=step_seed_of(i))
        log = log.add(result, int(next(iter(rows.values())).shape[0]))
    return log


@dataclass(frozen=True)
class LocalRound:
    """Which round this is and what its plan asks of this CU: round t, cluster n, m micro-batches per step,
    D = ``data_users`` data users (on ``user_devices``, one each), and the K = ``num_devices`` devices the step
    log counts."""

    round: int
    cluster: int
    m: int
    data_users: int
    num_devices: int
    user_devices: tuple[int, ...] = ()


def train_local_steps(
    pipeline: ClusterPipeline, head: HeadFn, cfg: ClusterConfig, task: Task, examples: list[int], at: LocalRound
) -> StepLog:
    """Round t's ``federation.local_steps`` steps on cluster n with m micro-batches (``at``), by one data stream,
    or by D = ``at.data_users`` data users each on its share, averaged."""
    clock = wiring.lr_clock(cfg)
    steps = cfg.federation.local_steps
    round_, cluster, m, num_devices = at.round, at.cluster, at.m, at.num_devices

    def seed_of(i: int) -> int | None:
        return step_seed(cfg.seed, round_, cluster, i) if cfg.runtime.seeded_dropout else None

    def one_stream(select: Select | None = None) -> StepLog:
        batches = itertools.islice(round_batches(task, cfg, examples, round_, cluster), steps)
        return run_steps(pipeline, head, batches, m, lambda i: clock.factor(round_, i), num_devices, select, seed_of)

    users = data_parallel.active_users(at.data_users, cfg.task.batch_size)
    if users == 1:
        return one_stream()
    if not isinstance(head, LocalHead):
        raise ConfigError(
            f"cluster {cluster}: the plan names {users} data users, which train the whole model on the CU "
            "(head_on_server: false); this method keeps the head on the server, so use a method with a local head"
        )
    return data_parallel.train_data_parallel(pipeline, head, users, one_stream, at.user_devices[:users])
