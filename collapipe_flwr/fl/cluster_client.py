"""The control unit (CU) of cluster n: one round of local training (Algorithm 1, lines 5-23).

On ``train``: load the global embedding + encoder, (re)build the cluster pipeline for the round's plan
(S, m, delta_k over the cluster's devices), run the round's local steps — each step: embedding on the
CU -> GPipe forward over the device actors -> z_enc to the head (the server's decoder over the data
plane, or a local head for methods that keep the whole model on the CU) -> dL/dz_enc back -> GPipe
backward -> every segment and the embedding update — then concatenate the segments (⊕, eq. 4) and
reply with the encoder and the round's metrics.

The device actors are built for the round's plan and shut down at its end (a round's plan may use other
devices than the last one). The one thing that survives between messages is the task object (read and
tokenised data, tokenizers) of the last run config seen, so a CU does not re-tokenise its data for the
hello and every round: :func:`cached_task`, keyed by everything the task is built from.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from collapipe_flwr import wiring
from collapipe_flwr.config import DATA_DIR_ENV, RunConfig, build_run_config, resolve_data_dir
from collapipe_flwr.fl.messages import TrainInstructions, pack_weights, unpack_weights
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.system.devices import DeviceProfile


@dataclass(frozen=True)
class ClusterIdentity:
    """Which cluster this CU is, from its node config (simulation and deployment alike)."""

    partition_id: int
    num_partitions: int
    data_dir: str = ""

    @classmethod
    def from_node_config(cls, node_config) -> "ClusterIdentity":
        from collapipe_flwr.errors import ConfigError

        try:
            pid = int(node_config["partition-id"])
            nparts = int(node_config["num-partitions"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                "this SuperNode has no partition-id/num-partitions; start it with "
                "--node-config \"partition-id=0 num-partitions=2\""
            ) from None
        if not 0 <= pid < nparts:
            raise ConfigError(f"partition-id={pid} must be in 0..{nparts - 1}; fix the SuperNode's --node-config")
        # This box's data: its node config, else its own COLLAPIPE_DATA_DIR, else the run's data_dir.
        data_dir = str(node_config.get("data-dir", "") or os.environ.get(DATA_DIR_ENV, "") or "")
        return cls(pid, nparts, data_dir)


_TASK_CACHE: dict[str, object] = {}


def cached_task(cfg: RunConfig):
    """The task for ``cfg``, reused while the task/model config, data dir, seed and cache dir stay the same
    (one entry: a new run's config replaces the last one's)."""
    key = json.dumps([cfg.task, cfg.model, str(resolve_data_dir(cfg.data_dir)), cfg.seed], sort_keys=True, default=str)
    if key not in _TASK_CACHE:
        _TASK_CACHE.clear()
        _TASK_CACHE[key] = wiring.build_task(cfg)
    return _TASK_CACHE[key]


def hello_metrics(identity: ClusterIdentity, run_config: dict) -> dict:
    """Reply to the server's hello: which cluster this is and how many training examples it holds."""
    cfg = wiring.config_from_run_config(run_config, data_dir=identity.data_dir)
    task = cached_task(cfg)
    examples = wiring.client_partition(task, cfg, identity.partition_id, identity.num_partitions)
    return {
        "partition-id": identity.partition_id,
        "num-partitions": identity.num_partitions,
        "num-examples": len(examples),
    }


def train_round(identity: ClusterIdentity, weights_record, instructions: TrainInstructions):
    """Run one round on this CU; returns (reply ArrayRecord, metrics dict)."""
    t_start = time.time()
    cfg: RunConfig = build_run_config(instructions.run_config)
    if identity.data_dir:
        cfg = wiring.with_data_dir(cfg, identity.data_dir)
    torch.set_num_threads(cfg.runtime.torch_threads)
    task = cached_task(cfg)
    examples = wiring.client_partition(task, cfg, identity.partition_id, identity.num_partitions)
    model = wiring.build_model(task, cfg)
    parts = unpack_weights(weights_record)
    model.embedding.load_state_dict(parts["embedding"])
    model.blocks.load_state_dict(parts["encoder"])
    if "head" in parts:
        model.head.load_state_dict(parts["head"])
    plan = instructions.plan
    devices = [DeviceProfile.from_dict(d) for d in instructions.devices]
    optimizer = wiring.optimizer_spec(cfg)
    t_setup = time.time()
    pipeline = wiring.build_pipeline(model, plan.delta, optimizer, devices, cfg, cluster=identity.partition_id, round_=instructions.round)
    head = None
    try:
        if cfg.method.head_on_server:
            head = wiring.dataplane_client(cfg, instructions, identity.partition_id)
        else:
            head = LocalHead(model.head, optimizer)
        t_built = time.time()
        losses = []
        step_seconds: dict[str, float] = {}
        device_compute = [0.0] * len(devices)
        n_examples = 0
        for batch in wiring.train_batches(task, cfg, examples, seed=wiring.round_seed(cfg, instructions.round, identity.partition_id)):
            result = pipeline.train_step(batch, plan.m, head)
            losses.append(float(result.loss))
            n_examples += int(next(iter(batch.values())).shape[0])
            for k, v in result.seconds.items():
                if k == "device_compute":  # {device index k: compute seconds this step}
                    for dev, sec in v.items():
                        device_compute[int(dev)] += float(sec)
                else:
                    step_seconds[k] = step_seconds.get(k, 0.0) + float(v)
        t_trained = time.time()
        reply_parts = {"embedding": pipeline.embedding_state_dict(), "encoder": pipeline.encoder_state_dict()}
        if not cfg.method.head_on_server:
            reply_parts["head"] = {k: v.detach().clone() for k, v in model.head.state_dict().items()}
        memory = pipeline.memory_report()
    finally:
        if head is not None and hasattr(head, "close"):
            head.close()
        pipeline.shutdown()
    device_peak = [0.0] * len(devices)  # per device k of the cluster; 0 for devices the plan left idle
    for report in memory:
        device_peak[int(report["device"])] = float(report["peak_bytes"])
    metrics = {
        "num-examples": n_examples,
        "train-loss": sum(losses) / max(len(losses), 1),
        "train-loss-first": losses[0] if losses else float("nan"),
        "train-loss-last": losses[-1] if losses else float("nan"),
        "train-losses": [float(x) for x in losses],
        "steps": len(losses),
        "seconds-setup": t_setup - t_start,
        "seconds-build-pipeline": t_built - t_setup,
        "seconds-train": t_trained - t_built,
        "seconds-total": time.time() - t_start,
        "device-peak-bytes": device_peak,
        "device-compute-seconds": device_compute,
        **{f"seconds-step-{k}": v for k, v in step_seconds.items()},
    }
    return pack_weights(reply_parts), metrics
