"""One CU process's state store: what it keeps between the messages it handles.

A :class:`CUStateStore` owns the process's task (the dataset and tokenizer, reused while the config stays the
same) and its sessions, one per (run, cluster) (``fl/cu/cluster_session.py``: the model skeleton, the device
pipeline, the optimizer state); it knows how to find and release a session's device actors, which Ray keeps
under names of the run and cluster whichever process started them. The ClientApp creates one store where it is
composed (``client_app.py``) and hands it to every handler, so a store's life is the process's: in Flower's
simulation one worker process serves many CUs' messages, each of them a session of the one store; a deployed
SuperNode may start a process per message, whose fresh store finds its state in Flower's ``Context.state`` and
on disk (``fl/cu/moments.py``). A second store in one process is a second process's state: it shares nothing
with the first (tests use this to run a round "in another process").
"""

from __future__ import annotations

import json

from flwr.app import ConfigRecord, RecordDict

from collapipe_flwr import wiring
from collapipe_flwr.config import ClusterConfig, resolve_data_dir
from collapipe_flwr.config.sections import EmbeddingMode
from collapipe_flwr.fl.cu.cluster_session import ClusterSession, actor_prefix
from collapipe_flwr.pipeline.executors import release
from collapipe_flwr.tasks.base import Task

STATE_PARTITION = "collapipe.cu-partition"  # Context.state ConfigRecord: this cluster's example indices


def task_key(cfg: ClusterConfig) -> str:
    """What a task is built from: the task and model config, the data dir and the seed."""
    return json.dumps(
        [cfg.task.to_raw(), cfg.model.to_raw(), str(resolve_data_dir(cfg.data_dir)), cfg.seed],
        sort_keys=True,
        default=str,
    )


class CUStateStore:
    """The task and the sessions of one CU process (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._sessions: dict[tuple[str, int], ClusterSession] = {}

    def cached_task(self, cfg: ClusterConfig) -> Task:
        """The task for ``cfg``, reused while the task/model config, data dir, seed and cache dir stay the same
        (one entry: a new run's config replaces the last one's)."""
        key = task_key(cfg)
        if key not in self._tasks:
            self._tasks.clear()
            self._tasks[key] = wiring.build_task(cfg)
        return self._tasks[key]

    def session_for(
        self, run_key: str, cluster: int, num_partitions: int, cfg: ClusterConfig, state: RecordDict | None = None
    ) -> ClusterSession:
        """This process's session of (run, cluster), built on first use (same task/model config); a new run's
        first session makes the store forget older runs' sessions (their device actors are left to their run's
        release)."""
        key = (run_key, cluster)
        session = self._sessions.get(key)
        if session is not None and _reusable(session.cfg, cfg):
            session.cfg = cfg
            return session
        if session is not None:
            session.close(release_devices=False)
        for other in [k for k in self._sessions if k[0] != run_key]:
            self._sessions.pop(other).close(release_devices=False)
        task = self.cached_task(cfg)
        wiring.check_partitions(cfg, num_partitions)
        examples = _partition(task, cfg, run_key, cluster, num_partitions, state)
        model = wiring.build_model(task, cfg)
        if (
            cfg.federation.embedding is EmbeddingMode.FROZEN
        ):  # kept at the global values the CU downloads, never trained
            model.embedding.requires_grad_(False)
        session = ClusterSession(run_key, cluster, cfg, task, examples, model)
        self._sessions[key] = session
        return session

    def existing_session(self, run_key: str, cluster: int) -> ClusterSession | None:
        """This process's session of cluster n in the run, if it has one."""
        return self._sessions.get((run_key, cluster))

    def drop_session(self, run_key: str, cluster: int, num_devices: int) -> int:
        """End (run, cluster) on this CU: kill its device actors (found by name, whichever process started
        them) and forget the session. Returns how many device actors were killed."""
        killed = release(actor_prefix(run_key, cluster), num_devices)
        session = self._sessions.pop((run_key, cluster), None)
        if session is not None:
            session.close(release_devices=True)
        return killed


def _reusable(old: ClusterConfig, new: ClusterConfig) -> bool:
    """A session built for ``old`` serves ``new``: the same task and model, runtime and pipeline."""
    return task_key(old) == task_key(new) and (old.runtime, old.pipeline) == (new.runtime, new.pipeline)


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
