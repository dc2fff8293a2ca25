"""Config -> objects: the one place that knows which package builds what.

The apps (``server_app.py``, ``client_app.py``), the strategy, the CU and the Hydra entry point call
these functions instead of reaching into each package, so a package can change its internals without
the others noticing. Nothing here holds state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch

from collapipe_flwr.config import AnyConfig, RunConfig, resolve_data_dir
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.optim import OptimizerSpec


# ----------------------------------------------------------------------------- validation
def validate_sections(cfg: RunConfig) -> None:
    """Let each owning package check its section once, at start-up (called by build_run_config)."""
    from collapipe_flwr.system.network import NetworkSpec
    from collapipe_flwr.tasks.registry import validate_task_config

    validate_task_config(cfg.task, cfg.model)
    NetworkSpec.from_config(cfg.network, cfg.federation.num_clusters)
    optimizer_spec(cfg)


# ----------------------------------------------------------------------------- task and model
def optimizer_spec(cfg: AnyConfig) -> OptimizerSpec:
    """The optimizer of every part (embedding on the CU, segments on devices, head on the server)."""
    raw = dict(cfg.model.get("optimizer") or {})
    try:
        return OptimizerSpec.from_dict(raw)
    except TypeError as err:
        raise ConfigError(f"model.optimizer has an unknown key ({err}); valid keys: name, lr, weight_decay, betas, momentum") from None


def cache_dir(cfg: AnyConfig) -> Path | None:
    value = str(cfg.task.get("cache_dir") or "")
    return Path(value).expanduser() if value else None


def build_task(cfg: AnyConfig):
    """The task object (data, tokenizer, collate, model builder, metric) for this run."""
    from collapipe_flwr.tasks.registry import build_task as _build

    return _build(cfg.task, cfg.model, resolve_data_dir(cfg.data_dir), cfg.seed, cache_dir(cfg))


def build_model(task, cfg: AnyConfig):
    """A freshly initialised SplitModel (same seed on the server and every CU, so shapes and names agree)."""
    return task.build_model(cfg.seed)


def check_partitions(cfg: AnyConfig, num_partitions: int) -> None:
    """A CU's num-partitions (node config) must equal federation.num_clusters (run config)."""
    if num_partitions != cfg.federation.num_clusters:
        raise ConfigError(
            f"this CU has num-partitions={num_partitions} but federation.num_clusters={cfg.federation.num_clusters}; "
            "make the SuperNodes' node config and the run config agree"
        )


def client_partition(task, cfg: AnyConfig, partition_id: int, num_partitions: int) -> list[int]:
    """Indices of cluster n's training examples (flwr-datasets partitioner, seeded)."""
    check_partitions(cfg, num_partitions)
    return list(task.partition(num_partitions, partition_id))


def batch_size(cfg: AnyConfig) -> int:
    return int(cfg.task.get("batch_size", 64))


def round_seed(cfg: AnyConfig, round_: int, cluster: int) -> int:
    """The data-order seed of cluster n in round t (the same on every machine)."""
    return cfg.seed * 1_000_003 + round_ * 101 + cluster


def train_batches(task, cfg: AnyConfig, indices: list[int], seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Exactly ``federation.local_steps`` batches of this CU's partition (cycling through epochs)."""
    steps = cfg.federation.local_steps
    if not indices:
        raise ConfigError("this CU's data partition is empty; use fewer clusters or more data")

    def epochs():
        for epoch in itertools.count():
            yield from task.batches(indices, batch_size(cfg), seed=seed + epoch, shuffle=True)

    return itertools.islice(epochs(), steps)


# ----------------------------------------------------------------------------- runtime
def build_pipeline(model, delta, optimizer: OptimizerSpec, devices, cfg: AnyConfig, cluster: int = 0, round_: int = 0,
                   actor_prefix: str = ""):
    """The CU-side GPipe driver over the partition delta (Ray actors or in-process stages). With
    ``actor_prefix`` the device actors are named and detached: a later round, or another CU process, finds
    them again even after every handle of the process that started them is gone (a deployed SuperNode runs
    a process per message); the run's ``release`` message, or the end of the Ray instance, ends them."""
    from collapipe_flwr.pipeline.cluster import ClusterPipeline
    from collapipe_flwr.precision import resolve_precision

    rt = cfg.runtime
    return ClusterPipeline(
        model.embedding,
        model.blocks,
        tuple(delta),
        optimizer,
        devices=devices,
        backend=rt.backend,
        ray_address=rt.ray_address or None,
        emulate=rt.emulate,
        actor_num_cpus=rt.actor_num_cpus,
        timeout_s=rt.device_timeout_s,
        name=f"cluster{cluster}",
        actor_prefix=actor_prefix,
        detached=bool(actor_prefix),
        precision=resolve_precision(rt.precision),
        prestart=rt.prestart_devices,
    )


def dataplane_client(cfg: AnyConfig, instructions, cluster: int):
    """The remote head (the server's decoder) for this CU's round."""
    from collapipe_flwr.fl.dataplane import DecoderClient

    return DecoderClient(
        instructions.dataplane_address,
        instructions.dataplane_secret,
        round=instructions.round,
        cluster=cluster,
        fp16=cfg.dataplane.fp16,
        timeout_s=cfg.dataplane.timeout_s,
        max_message_mb=cfg.dataplane.max_message_mb,
    )


def lr_schedule(cfg: AnyConfig):
    """model.schedule on the federated path: ``factor(global_step)`` with global step
    (t - 1) * local_steps + i of round t's i-th local step, and total_steps = T * local_steps unless set.
    The same factor scales the CU's embedding, every device segment and the server's decoder."""
    from collapipe_flwr.tasks.lr_schedule import lr_factor

    sched = dict(cfg.model.get("schedule") or {})
    total = int(sched.get("total_steps") or 0) or cfg.federation.num_rounds * cfg.federation.local_steps
    warmup = int(sched.get("warmup_steps", 0))
    decay = str(sched.get("decay", "none"))
    floor = float(sched.get("min_factor", 0.0))

    def factor(step: int) -> float:
        return lr_factor(step, warmup, decay, total, floor)

    return factor


def global_step(cfg: AnyConfig, round_: int, local_step: int) -> int:
    """The run-wide index of round t's ``local_step``-th step (0-based), the schedule's clock."""
    return (int(round_) - 1) * cfg.federation.local_steps + int(local_step)
