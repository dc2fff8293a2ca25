"""Config -> objects: the one place that knows which package builds what.

The server (``fl/server/server_state.py``), the CU (``fl/cu/cluster_client.py``, ``fl/cu/cluster_session.py``) and the
entry points call these functions instead of reaching into each package, so a package can change its
internals without the others noticing. Every function takes the already-parsed config (a
:class:`~collapipe_flwr.config.RunConfig` on the server, a :class:`~collapipe_flwr.config.ClusterConfig`
on a CU); nothing here parses or holds state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch

from collapipe_flwr.config import AnyConfig, resolve_data_dir
from collapipe_flwr.config.sections import EmbeddingMode
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.tasks.base import Task
from collapipe_flwr.tasks.lr_schedule import LrClock
from collapipe_flwr.tasks.registry import build_task as _build_task


# ----------------------------------------------------------------------------- task and model
def optimizer_spec(cfg: AnyConfig) -> OptimizerSpec:
    """The optimizer of every part (embedding on the CU, segments on devices, head on the server)."""
    return cfg.model.optimizer


def cache_dir(cfg: AnyConfig) -> Path | None:
    value = cfg.task.cache_dir
    return Path(value).expanduser() if value else None


def build_task(cfg: AnyConfig) -> Task:
    """The task object (data, tokenizer, collate, model builder, metric) for this run."""
    return _build_task(cfg.task, cfg.model, resolve_data_dir(cfg.data_dir), cfg.seed, cache_dir(cfg))


def build_model(task: Task, cfg: AnyConfig) -> SplitModel:
    """A freshly initialised SplitModel (same seed on the server and every CU, so shapes and names agree)."""
    return task.build_model(cfg.seed)


def embedding_travels(cfg: AnyConfig) -> bool:
    """Whether CUs train and return the embedding (eq. 11): ``federation.embedding: trained`` and not frozen by
    LoRA (``model.lora.enabled``: the CU's embedding is a frozen base weight, only the adapters travel)."""
    return cfg.federation.embedding is EmbeddingMode.TRAINED and not cfg.model.adapters_only


def check_partitions(cfg: AnyConfig, num_partitions: int) -> None:
    """A CU's num-partitions (node config) must equal federation.num_clusters (run config)."""
    if num_partitions != cfg.federation.num_clusters:
        raise ConfigError(
            f"this CU has num-partitions={num_partitions} but federation.num_clusters={cfg.federation.num_clusters}; "
            "make the SuperNodes' node config and the run config agree"
        )


def client_partition(task: Task, cfg: AnyConfig, partition_id: int, num_partitions: int) -> list[int]:
    """Indices of cluster n's training examples (flwr-datasets partitioner, seeded)."""
    check_partitions(cfg, num_partitions)
    return list(task.partition(num_partitions, partition_id))


def batch_size(cfg: AnyConfig) -> int:
    """b (paper Table II: 64)."""
    return cfg.task.batch_size


def round_seed(cfg: AnyConfig, round_: int, cluster: int) -> int:
    """The data-order seed of cluster n in round t (the same on every machine)."""
    return cfg.seed * 1_000_003 + round_ * 101 + cluster


def partition_batches(task: Task, cfg: AnyConfig, indices: list[int], seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """This CU's partition as batches, epoch after epoch without end (epoch e shuffled with ``seed + e``); a
    round takes its ``federation.local_steps`` from the front (``fl/cu/local_steps.py``)."""
    if not indices:
        raise ConfigError("this CU's data partition is empty; use fewer clusters or more data")
    for epoch in itertools.count():
        yield from task.batches(indices, batch_size(cfg), seed=seed + epoch, shuffle=True)


# ----------------------------------------------------------------------------- runtime
def build_pipeline(
    model: SplitModel,
    delta: tuple[int, ...],
    optimizer: OptimizerSpec,
    devices: list[DeviceProfile],
    cfg: AnyConfig,
    cluster: int = 0,
    actor_prefix: str = "",
) -> ClusterPipeline:
    """The CU-side pipeline driver over the partition delta (Ray actors or in-process stages), in the run's
    ``pipeline.schedule`` (gpipe | 1f1b) and ``pipeline.checkpoint``. With
    ``actor_prefix`` the device actors are named and detached: a later round, or another CU process, finds
    them again even after every handle of the process that started them is gone (a deployed SuperNode runs
    a process per message); the run's ``release`` message, or the end of the Ray instance, ends them."""
    runtime = ClusterRuntime(
        cfg.runtime,
        name=f"cluster{cluster}",
        actor_prefix=actor_prefix,
        schedule=cfg.pipeline.schedule,
        checkpoint=cfg.pipeline.checkpoint,
    )
    return ClusterPipeline(model.embedding, model.blocks, tuple(delta), optimizer, devices, runtime)


def lr_clock(cfg: AnyConfig) -> LrClock:
    """model.lr_schedule on the federated path: T = federation.num_rounds rounds of federation.local_steps steps."""
    local_steps = cfg.federation.local_steps
    return LrClock(cfg.model.lr_schedule, local_steps, cfg.federation.num_rounds * local_steps)
