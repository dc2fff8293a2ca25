"""What a CU keeps across the rounds of one run: the model skeleton, the device pipeline, optimizer state.

A round loads the global theta^emb and theta^enc *in place* (into the live embedding and the live device
segments), re-partitions only when the plan's delta (or S) changes — blocks move between the live device
actors with their optimizer state, no actor is restarted — and leaves everything running for the next
round. ``federation.optimizer_state`` chooses what happens to the optimizer moments at a round's start:
``keep`` (they survive the weight reload) or ``reset`` (fresh optimizer state every round).

Where the state lives, so that it survives however Flower runs the CU:
- the session itself: in the process's state store (``fl/cu/state_store.py``), which builds and forgets it;
- device segments and their optimizer state: in the device actors, named per run and cluster
  (``pipeline.executors.actor_name``), so any process of this CU finds them again;
- the CU's own optimizer state (embedding; the head for methods that train it on the CU; the segments on
  the in-process ``local`` backend): in this session, and after every round in the round's moment stores
  (``fl/cu/moments.py``: Flower's per-node ``Context.state``, and the CU's checkpoint on disk when the server
  keeps one), restored from them when a round lands in another process or a resumed run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from collapipe_flwr import wiring
from collapipe_flwr.config import ClusterConfig
from collapipe_flwr.config.sections import OptimizerState
from collapipe_flwr.fl.cu.moments import MomentStore
from collapipe_flwr.fl.round_report import Preparation
from collapipe_flwr.models.split import SplitModel, TaskHead
from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.pipeline.head import LocalHead
from collapipe_flwr.pipeline.runtime_spec import Backend
from collapipe_flwr.precision import resolve_precision
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.tasks.base import Task


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
        moments: Sequence[MomentStore],
    ) -> Preparation:
        """Load the global weights in place, (re)partition, set the optimizer state for round ``round_`` (kept
        from the last round, else the first of ``moments`` that has this run's); returns what that did."""
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
            pipeline.placement.repartition(delta)
        moved = pipeline.placement.moved_blocks
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
            restored = self._restore(moments, round_)
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

    def finish(self, round_: int, moments: Sequence[MomentStore]) -> None:
        """After a round: remember it, and hand the optimizer moments to each of ``moments`` (what it keeps:
        the CU-held ones, or every one, the devices' included); each stores them at once, before any optimizer
        steps again, so the live tensors need no copy."""
        self.last_round = round_
        if self.cfg.federation.optimizer_state is OptimizerState.RESET:
            return
        for store in moments:
            store.save(round_, self._optimizer_tensors(with_encoder=store.with_devices))

    def live_pipeline(self) -> ClusterPipeline:
        """The device pipeline that :meth:`prepare` built (or reused) for this round."""
        if self.pipeline is None:
            raise RuntimeError(f"cluster {self.cluster} of run {self.run_key} has no pipeline; call prepare() first")
        return self.pipeline

    def close(self, release_devices: bool = True) -> None:
        if self.pipeline is not None and release_devices:
            self.pipeline.shutdown()
        self.pipeline = None

    # -- optimizer state between rounds (fl/cu/moments.py) -------------------------------------------
    def _optimizers(self) -> dict[str, tuple[torch.optim.Optimizer, torch.nn.Module]]:
        out = {"embedding": (self.live_pipeline().step.embedding_optimizer, self.model.embedding)}
        if self.local_head is not None and self.local_head.optimizer is not None:
            out["head"] = (self.local_head.optimizer, self.model.head)
        return out

    def _optimizer_tensors(self, with_encoder: bool = False) -> dict[str, torch.Tensor]:
        """The CU's optimizer moments, flattened ``part|param|key``; the segments' too on the local backend or
        when ``with_encoder`` (gathered from the device actors). The live tensors, for a caller that stores
        them before the next optimizer step (at BERT-base size the encoder's moments are 680 MB)."""
        flat: dict[str, torch.Tensor] = {}
        for part, (optimizer, module) in self._optimizers().items():
            names = {id(p): n for n, p in module.named_parameters()}
            for p, st in optimizer.state.items():
                for key, value in st.items():
                    flat[f"{part}|{names[id(p)]}|{key}"] = torch.as_tensor(value).detach()
        pipeline = self.live_pipeline()
        if pipeline.backend is Backend.LOCAL or with_encoder:
            for name, st in pipeline.placement.encoder_optimizer_state().items():
                for key, value in st.items():
                    flat[f"encoder|{name}|{key}"] = torch.as_tensor(value).detach()
        return flat

    def _restore(self, moments: Sequence[MomentStore], round_: int) -> bool:
        """Load the moments of this run's last round before ``round_`` from the first of ``moments`` that holds
        them (Context.state: the last round's in another process of this CU; the disk: a resumed run's)."""
        for store in moments:
            tensors = store.load(before_round=round_)
            if tensors is not None:
                self._load_tensors(tensors, encoder=store.with_devices)
                return True
        return False

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
            pipeline.placement.load_encoder_optimizer_state(grouped["encoder"])
