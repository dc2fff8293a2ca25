"""What a CU keeps across the rounds of one run: the model skeleton, the device pipeline, optimizer state.

A round loads the global theta^emb and theta^enc *in place* (into the live embedding and the live device
segments), re-partitions only when the plan's delta (or S) changes — blocks move between the live device
actors with their optimizer state, no actor is restarted — and leaves everything running for the next
round. ``federation.optimizer_state`` chooses what happens to the optimizer moments at a round's start:
``keep`` (they survive the weight reload) or ``reset`` (fresh optimizer state every round).

Where the state lives, so that it survives however Flower runs the CU:
- device segments and their optimizer state: in the device actors, named per run and cluster
  (``pipeline.executors.actor_name``), so any process of this CU finds them again;
- the CU's own optimizer state (embedding; the head for methods that train it on the CU; the segments on
  the in-process ``local`` backend): in this process's session, and a copy in Flower's per-node
  ``Context.state`` after every round, restored when a round lands in another process (Flower's simulation
  runs a node's messages on any worker of its pool; a deployed SuperNode starts a process per message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from collapipe_flwr import wiring
from collapipe_flwr.config import ClusterConfig, resolve_data_dir
from collapipe_flwr.config.sections import EmbeddingMode, OptimizerState
from collapipe_flwr.fl.cu.cu_checkpoint import load_cu_state, save_cu_state
from collapipe_flwr.fl.round_report import Preparation
from collapipe_flwr.models.split import SplitModel, TaskHead
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.executors import release
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.runtime_spec import Backend
from collapipe_flwr.precision import resolve_precision
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.tasks.base import Task

STATE_ARRAYS = "collapipe.cu-optimizer"  # Context.state ArrayRecord: flattened optimizer moments
STATE_INFO = "collapipe.cu-info"  # Context.state ConfigRecord: {"session": run key, "round": t}
STATE_PARTITION = "collapipe.cu-partition"  # Context.state ConfigRecord: this cluster's example indices

_TASKS: dict[str, Task] = {}
_SESSIONS: dict[tuple[str, int], ClusterSession] = {}


def task_key(cfg: ClusterConfig) -> str:
    return json.dumps(
        [cfg.task.to_raw(), cfg.model.to_raw(), str(resolve_data_dir(cfg.data_dir)), cfg.seed],
        sort_keys=True,
        default=str,
    )


def cached_task(cfg: ClusterConfig) -> Task:
    """The task for ``cfg``, reused while the task/model config, data dir, seed and cache dir stay the same
    (one entry: a new run's config replaces the last one's)."""
    key = task_key(cfg)
    if key not in _TASKS:
        _TASKS.clear()
        _TASKS[key] = wiring.build_task(cfg)
    return _TASKS[key]


class ReleasedPart(torch.nn.ModuleList):
    """Stands in for a part of the model this CU process no longer holds a copy of (the devices hold the TEBs,
    the server the head): it has no parameters, and using it is a bug, so every use raises."""

    def __init__(self, part: str) -> None:
        super().__init__()
        self.part = part

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(
            f"this CU released its copy of the {self.part} once the pipeline held it (ClusterSession.prepare); "
            "read the trained values from the pipeline (encoder_state_dict) instead"
        )

    forward = __iter__ = __len__ = __getitem__ = _refuse


def actor_prefix(run_key: str, cluster: int) -> str:
    return f"collapipe-{run_key}-cluster{cluster}"


@dataclass
class ClusterSession:
    """One cluster's training state for one run (see the module docstring)."""

    run_key: str
    cluster: int
    cfg: ClusterConfig
    task: Task
    examples: list[int]
    model: SplitModel
    pipeline: ClusterPipeline | None = None
    local_head: LocalHead | None = None
    last_round: int = 0
    state_key: str = ""  # the run's key for this CU's on-disk moments (fl/cu/cu_checkpoint.py); "" = none kept

    # -- per round ----------------------------------------------------------------------------------
    def prepare(
        self,
        round_: int,
        parts: dict[str, dict[str, torch.Tensor]],
        delta: tuple[int, ...],
        devices: list[DeviceProfile],
        state: RecordDict | None,
    ) -> Preparation:
        """Load the global weights in place, (re)partition, set the optimizer state for round ``round_``;
        returns what that did."""
        cfg = self.cfg
        self.model.embedding.load_state_dict(parts["embedding"])
        if "head" in parts:
            self.model.head.load_state_dict(parts["head"])
        reused = self.pipeline is not None
        if self.pipeline is None:
            self.model.blocks.load_state_dict(parts["encoder"])
            pipeline = self.pipeline = wiring.build_pipeline(
                self.model,
                delta,
                wiring.optimizer_spec(cfg),
                devices,
                cfg,
                cluster=self.cluster,
                actor_prefix=actor_prefix(self.run_key, self.cluster) if cfg.runtime.backend is Backend.RAY else "",
            )
            self._release_held_copies()
        else:
            pipeline = self.pipeline
            pipeline.repartition(delta)
        moved = bool(getattr(pipeline, "moved_blocks", False))
        pipeline.load_encoder_state_dict(parts["encoder"])
        if not cfg.head_on_server and self.local_head is None:
            self.local_head = LocalHead(
                self.model.head, wiring.optimizer_spec(cfg), resolve_precision(cfg.runtime.precision)
            )
        restored = False
        if cfg.federation.optimizer_state is OptimizerState.RESET:
            pipeline.reset_optimizers()
            if self.local_head is not None:
                self.local_head.reset_optimizer()
        elif self.last_round != round_ - 1 or not reused:
            restored = bool(self._restore(state) or self._restore_from_disk(round_))
        return Preparation(pipeline_reused=reused, blocks_moved=moved, optimizer_restored=restored)

    def _release_held_copies(self) -> None:
        """Drop this process's copies of the parts others now hold: the TEBs theta^1..theta^L, copied into the
        device stages (which train them and give theta^enc back, eq. 4), and the head when it trains on the
        server. A CU session then holds what the CU trains (the embedding; a CU-side head). Flower's simulation
        keeps a session per CU in each ClientApp worker; at BERT-base size a session's parameters fall from 390
        to 63 MiB. Kept under LoRA (``model.adapters_only``): the frozen base weights fill in adapters-only
        downloads."""
        if self.cfg.model.adapters_only:
            return
        self.model.blocks = ReleasedPart("encoder blocks")
        if self.cfg.head_on_server:
            self.model.head = cast(TaskHead, ReleasedPart("head"))

    def recover(self, parts: dict[str, dict[str, torch.Tensor]], delta: tuple[int, ...], lost: list[int]) -> None:
        """After device failures mid-round: back to the round's starting weights (``parts``) with ``delta``
        (0 on every ``lost`` device) on the devices left, fresh optimizer state everywhere."""
        self.model.embedding.load_state_dict(parts["embedding"])
        if "head" in parts:
            self.model.head.load_state_dict(parts["head"])
        self.live_pipeline().recover(delta, parts["encoder"], lost)
        if self.local_head is not None:
            self.local_head.reset_optimizer()

    def finish(self, round_: int, state: RecordDict | None) -> None:
        """After a round: remember it, and copy the CU-held optimizer state into ``Context.state``."""
        self.last_round = round_
        if self.cfg.federation.optimizer_state is OptimizerState.RESET:
            return
        if state is not None:
            state.array_records[STATE_ARRAYS] = ArrayRecord(torch_state_dict=self._optimizer_tensors())
            state.config_records[STATE_INFO] = ConfigRecord({"session": self.run_key, "round": int(round_)})
        if self.state_key:  # the CU's half of the run's checkpoint: every moment, the devices' included
            # written at once, before any optimizer steps again, so the live tensors need no copy
            tensors = self._optimizer_tensors(with_encoder=True, copy=False)
            save_cu_state(self.state_key, self.cluster, round_, tensors)

    def live_pipeline(self) -> ClusterPipeline:
        """The device pipeline that :meth:`prepare` built (or reused) for this round."""
        if self.pipeline is None:
            raise RuntimeError(f"cluster {self.cluster} of run {self.run_key} has no pipeline; call prepare() first")
        return self.pipeline

    def close(self, release_devices: bool = True) -> None:
        if self.pipeline is not None and release_devices:
            self.pipeline.shutdown()
        self.pipeline = None

    # -- optimizer state in Context.state ------------------------------------------------------------
    def _optimizers(self) -> dict[str, tuple[torch.optim.Optimizer, torch.nn.Module]]:
        out = {"embedding": (self.live_pipeline().embedding_optimizer, self.model.embedding)}
        if self.local_head is not None and self.local_head.optimizer is not None:
            out["head"] = (self.local_head.optimizer, self.model.head)
        return out

    def _optimizer_tensors(self, with_encoder: bool = False, copy: bool = True) -> dict[str, torch.Tensor]:
        """The CU's optimizer moments, flattened ``part|param|key``; the segments' too on the local backend or
        when ``with_encoder`` (gathered from the device actors). ``copy=False`` hands out the live tensors, for
        a caller that writes them before the next optimizer step (at BERT-base size the encoder's moments are
        680 MB)."""
        detach = (lambda t: t.detach().clone()) if copy else (lambda t: t.detach())
        flat: dict[str, torch.Tensor] = {}
        for part, (optimizer, module) in self._optimizers().items():
            names = {id(p): n for n, p in module.named_parameters()}
            for p, st in optimizer.state.items():
                for key, value in st.items():
                    flat[f"{part}|{names[id(p)]}|{key}"] = detach(torch.as_tensor(value))
        pipeline = self.live_pipeline()
        if pipeline.backend is Backend.LOCAL or with_encoder:
            for name, st in pipeline.encoder_optimizer_state().items():
                for key, value in st.items():
                    flat[f"encoder|{name}|{key}"] = detach(torch.as_tensor(value))
        return flat

    def _restore(self, state: RecordDict | None) -> bool:
        """Load the optimizer moments the last round of this run left in ``Context.state``."""
        if state is None or STATE_ARRAYS not in state.array_records or STATE_INFO not in state.config_records:
            return False
        info = state.config_records[STATE_INFO]
        if str(info.get("session")) != self.run_key:
            return False
        self._load_tensors(state.array_records[STATE_ARRAYS].to_torch_state_dict(), encoder=False)
        return True

    def _restore_from_disk(self, round_: int) -> bool:
        """Load the moments this cluster saved after its last round before t (a resumed run's first round:
        fl/cu/cu_checkpoint.py), as the process that ran that round would still hold them."""
        if not self.state_key:
            return False
        tensors = load_cu_state(self.state_key, self.cluster, before=round_)
        if tensors is None:
            return False
        self._load_tensors(tensors, encoder=True)
        return True

    def _load_tensors(self, flat: dict[str, torch.Tensor], encoder: bool) -> None:
        grouped: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
        for name, value in flat.items():
            part, pname, key = name.split("|")
            grouped.setdefault(part, {}).setdefault(pname, {})[key] = value
        for part, (optimizer, module) in self._optimizers().items():
            params = dict(module.named_parameters())
            for pname, st in grouped.get(part, {}).items():
                if pname in params:
                    optimizer.state[params[pname]] = {k: v.clone() for k, v in st.items()}
        pipeline = self.live_pipeline()
        if "encoder" in grouped and (pipeline.backend is Backend.LOCAL or encoder):
            pipeline.load_encoder_optimizer_state(grouped["encoder"])


def _partition(
    task: Task, cfg: ClusterConfig, run_key: str, cluster: int, num_partitions: int, state: RecordDict | None
) -> list[int]:
    """Cluster n's example indices; kept in ``Context.state`` so another CU process of the same run reuses
    them instead of partitioning again (flwr-datasets' import and partitioning cost seconds)."""
    if state is not None and STATE_PARTITION in state.config_records:
        record = state.config_records[STATE_PARTITION]
        indices = record.get("indices")
        if str(record.get("session")) == run_key and record.get("cluster", -1) == cluster and isinstance(indices, list):
            return [int(i) for i in indices]
    indices = wiring.client_partition(task, cfg, cluster, num_partitions)
    if state is not None:
        state.config_records[STATE_PARTITION] = ConfigRecord(
            {"session": run_key, "cluster": cluster, "indices": [int(i) for i in indices]}
        )
    return indices


def session_for(
    run_key: str, cluster: int, num_partitions: int, cfg: ClusterConfig, state: RecordDict | None = None
) -> ClusterSession:
    """This process's session of (run, cluster), built on first use (same task/model config)."""
    key = (run_key, cluster)
    session = _SESSIONS.get(key)
    same_pipeline = session is not None and (session.cfg.runtime, session.cfg.pipeline) == (cfg.runtime, cfg.pipeline)
    if session is not None and task_key(session.cfg) == task_key(cfg) and same_pipeline:
        session.cfg = cfg
        return session
    if session is not None:
        session.close(release_devices=False)
    for other in [k for k in _SESSIONS if k[0] != run_key]:  # a new run: this process forgets older runs
        _SESSIONS.pop(other).close(release_devices=False)
    task = cached_task(cfg)
    wiring.check_partitions(cfg, num_partitions)
    examples = _partition(task, cfg, run_key, cluster, num_partitions, state)
    model = wiring.build_model(task, cfg)
    if cfg.federation.embedding is EmbeddingMode.FROZEN:  # kept at the global values the CU downloads, never trained
        model.embedding.requires_grad_(False)
    session = ClusterSession(run_key, cluster, cfg, task, examples, model)
    _SESSIONS[key] = session
    return session


def existing_session(run_key: str, cluster: int) -> ClusterSession | None:
    """This process's session of cluster n in the run, if it has one."""
    return _SESSIONS.get((run_key, cluster))


def drop_session(run_key: str, cluster: int, num_devices: int) -> int:
    """End (run, cluster) on this CU: kill its device actors (found by name, whichever process started them)
    and forget the session. Returns how many device actors were killed."""
    killed = release(actor_prefix(run_key, cluster), num_devices)
    session = _SESSIONS.pop((run_key, cluster), None)
    if session is not None:
        session.close(release_devices=True)
    return killed
