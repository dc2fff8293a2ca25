"""A device's Ray actor (:class:`StageActor`) and the Ray calls around it: starting Ray, naming, placing and
releasing the actors of a run. With ``ray_stages`` the only modules of the package that import Ray.

Device k's actor of one cluster of one run is the named actor ``actor_name(prefix, k)`` in namespace
``collapipe``: a later round, or another process of the same CU (Flower's simulation runs a CU's messages on any
worker of its pool; a deployed SuperNode starts one ClientApp process per message), finds the same live actor by
name instead of starting a new one. Detached actors outlive the process that created them; :func:`release` kills
them at the run's end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from collapipe_flwr.heap_trim import trim_heap
from collapipe_flwr.pipeline.executors import shm_handoff
from collapipe_flwr.pipeline.process_memory import ProcessMemory
from collapipe_flwr.pipeline.runtime_spec import Handoff
from collapipe_flwr.pipeline.stage import Stage
from collapipe_flwr.testbed import remove_stale

NAMESPACE = "collapipe"


class RemoteMethod(Protocol):
    """One method of a Ray actor handle: ``.remote(*args)`` starts it and answers an ObjectRef."""

    def remote(self, *args: Any) -> Any: ...


class DeviceActor(Protocol):
    """The Ray actor handle of a :class:`StageActor` as :class:`RayStages` uses it (Ray types a handle's
    methods dynamically, so this names every one called: each a :class:`StageActor` method)."""

    # placement and the actor's process
    load_segment: RemoteMethod
    layout: RemoteMethod
    ping: RemoteMethod
    pin: RemoteMethod
    node_id: RemoteMethod
    set_handoff: RemoteMethod
    warm_up: RemoteMethod
    missing_modules: RemoteMethod
    process: RemoteMethod
    memory_cgroup_path: RemoteMethod
    leave_host: RemoteMethod
    # one step
    begin_step: RemoteMethod
    forward: RemoteMethod
    backward: RemoteMethod
    step: RemoteMethod
    trace: RemoteMethod
    memory_report: RemoteMethod
    # weights and optimizer state
    get_weights: RemoteMethod
    set_weights: RemoteMethod
    get_optimizer_state: RemoteMethod
    load_optimizer_state: RemoteMethod
    reset_optimizer: RemoteMethod
    # the testbed and measurement
    set_testbed: RemoteMethod
    clear_testbed: RemoteMethod
    profile_compute: RemoteMethod
    send_payload: RemoteMethod
    receive_payload: RemoteMethod
    _actor_id: Any


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 32


def bound_onednn_cache(memory_counted: bool) -> None:
    """Bound oneDNN's primitive cache at :data:`ONEDNN_CACHE_CAPACITY` in a device process whose memory the kernel
    counts (a memory cgroup: C7 measured or enforced), unless the environment sets it already.

    oneDNN keeps a compiled primitive per matmul shape (1024 by default); under bf16 autocast the batches' varying
    lengths fill it round after round. On 6 rounds of the default run, 32 cut each device's measured peak by 40-80
    MiB (the median relative error against C7 from 39-62% to 26-52% a round), but the primitives it recompiles cost
    1-2 s a round (docs/testbed.md), so a device that nothing limits keeps oneDNN's default."""
    if memory_counted:
        os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))


def actor_name(prefix: str, k: int) -> str:
    """The Ray name of device k's actor for one cluster of one run (``prefix`` = run and cluster)."""
    return f"{prefix}.device{k}"


class StageActor(Stage):
    """A :class:`Stage` inside a Ray actor, with its own torch thread count and (optionally) CPU cores.

    Its activations and gradients travel as the CU's :class:`RayStages` chose (``runtime.handoff``,
    :meth:`set_handoff`): as tensors through Ray's object store, or parked in shared memory
    (``shm_handoff``) with only their handles crossing Ray."""

    def __init__(self, threads: int, *args, memory_cgroup: str = "", **kwargs) -> None:
        # first, idle: the memory figures count from here, and with ``memory_cgroup`` (its name) this process joins
        # its own memory cgroup before it holds a block (pipeline/process_memory.py)
        kwargs["process_memory"] = ProcessMemory.start(memory_cgroup)
        bound_onednn_cache(bool(memory_cgroup))  # before any compute: oneDNN reads it at its first primitive
        self._all_cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        torch.set_num_threads(max(1, int(threads)))
        self._handoff = Handoff.OBJECT_STORE
        self._parking = shm_handoff.ParkingLot()
        super().__init__(*args, **kwargs)

    def node_id(self) -> str:
        """The Ray node this actor runs on (the CU compares it with its own for ``runtime.handoff``)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def memory_cgroup_path(self) -> str:
        """This process's memory cgroup ("" = none): the CU reads its OOM-kill count if this process dies."""
        group = self.process_memory.cgroup if self.process_memory is not None else None
        return str(group.path) if group is not None else ""

    def set_handoff(self, mode: str) -> Handoff:
        """Send this actor's outputs as ``mode`` (``shm`` | ``object_store``) from now on."""
        self._handoff = Handoff(mode)
        return self._handoff

    def _handover(self, value):
        """``value`` (a tensor, or a state dict or optimizer state holding tensors) with its large tensors parked in
        shared memory when this actor's hand-over is ``shm``; as it is otherwise."""
        return self._parking.handover_tree(value) if self._handoff is Handoff.SHM else value

    def leave_host(self) -> None:
        """Undo what this process holds on its host before it is killed: its testbed cgroup and throttle, its
        hand-over folder in /dev/shm."""
        self.clear_testbed()
        self._parking.remove()
        if self.process_memory is not None:
            self.process_memory.remove()

    def begin_step(self, step_seed: int | None = None, micro_batches: int | None = None) -> int:
        self._parking.clear()  # tensors a failed step parked and nobody read
        return super().begin_step(step_seed, micro_batches)

    def forward(self, mb_index: int, x, attention_mask):
        return self._handover(super().forward(mb_index, shm_handoff.resolve(x), shm_handoff.resolve(attention_mask)))

    def backward(self, mb_index: int, grad_out):
        return self._handover(super().backward(mb_index, shm_handoff.resolve(grad_out)))

    def load_segment(
        self,
        segment: nn.ModuleList,
        optimizer_state: dict | None,
        slowdown: float,
        offset: int,
        parked: dict | None = None,
    ) -> int:
        """As :meth:`Stage.load_segment`; with ``parked``, ``segment`` is a skeleton on the meta device whose weights
        wait in shared memory (``shm_handoff.parked_module``), and the optimizer state may be parked too. A round's
        segment arrives when the last round's activations are freed: their heap pages go back first (heap_trim.py)."""
        trim_heap()
        if parked is not None:
            segment = shm_handoff.unparked_module(segment, parked)
        return super().load_segment(segment, shm_handoff.resolve_tree(optimizer_state), slowdown, offset)

    def get_weights(self) -> dict:
        return self._handover(super().get_weights())

    def set_weights(self, state: dict) -> None:
        super().set_weights(shm_handoff.resolve_tree(state))

    def get_optimizer_state(self) -> dict:
        return self._handover(super().get_optimizer_state())

    def load_optimizer_state(self, state: dict) -> None:
        super().load_optimizer_state(shm_handoff.resolve_tree(state))

    def send_payload(self, nbytes: int):
        return self._handover(super().send_payload(nbytes))

    def receive_payload(self, tensor) -> int:
        return super().receive_payload(shm_handoff.resolve(tensor))

    def pin(self, cores: Sequence[int] | None, threads: int, node_id: str) -> list[int]:
        """Run every thread of this process on ``cores`` (None, or a driver on another node: the cores
        the actor started with) with ``threads`` torch threads; returns the cores it now runs on."""
        import ray

        if node_id != ray.get_runtime_context().get_node_id():
            cores = None  # the CU's core numbers mean nothing on another host
        target = set(cores) if cores else set(self._all_cores)
        if target and hasattr(os, "sched_setaffinity"):
            for tid in os.listdir("/proc/self/task"):  # torch's OpenMP threads already exist: pin each
                try:
                    os.sched_setaffinity(int(tid), target)
                except OSError:  # a thread that ended meanwhile, or a core this container lacks
                    pass
        torch.set_num_threads(max(1, int(threads)))
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


_REMOTE_STAGE = None


def remote_stage_class():
    global _REMOTE_STAGE
    if _REMOTE_STAGE is None:
        import ray

        _REMOTE_STAGE = ray.remote(StageActor)
    return _REMOTE_STAGE


def ensure_ray(address: str | None = None) -> None:
    """``ray.init`` unless Ray is already up (e.g. inside a Flower simulation); ``address`` joins a cluster."""
    import ray

    if not ray.is_initialized():
        # Ray's announced default (num_gpus=0 actors keep the visible devices) chosen explicitly: no
        # FutureWarning on every start (ray/_private/worker.py); a value the user set is kept.
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}
        if address:
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except RuntimeError as err:
            # a local head whose GCS server did not write its port file in time (a loaded machine: seen once in a
            # CI run of the whole suite) is started once more; any other failure, or a second one, propagates
            if address or "Timed out waiting for file" not in str(err):
                raise
            ray.shutdown()
            ray.init(**kwargs)


def creation_error(err: BaseException) -> str:
    """The last ``...Error: message`` line of a Ray actor's creation failure ("" when there is none): e.g. a
    ConfigError raised in the actor's constructor (runtime.device=cuda on a box without a GPU)."""
    for line in reversed(str(err).splitlines()):
        if "Error: " in line:
            return line.strip()
    return ""


def device_resources(pattern: str, k: int) -> dict[str, Any]:
    """Ray actor options that pin device k's actor to the node offering the custom resource named by
    ``pattern`` (runtime.device_resource: ``{k}`` replaced by k, or k appended); {} = Ray's default scheduling."""
    if not pattern:
        return {}
    name = pattern.replace("{k}", str(k)) if "{k}" in pattern else f"{pattern}{k}"
    return {"resources": {name: 1.0}}


def release(prefix: str, num_devices: int) -> int:
    """Kill the named device actors ``actor_name(prefix, k)``, k < num_devices (a run's end on a CU);
    returns how many were alive. Does nothing when Ray is not running in this process."""
    import ray

    if not ray.is_initialized():
        return 0
    killed = 0
    for k in range(num_devices):
        try:
            actor = ray.get_actor(actor_name(prefix, k), namespace=NAMESPACE)
        except ValueError:
            continue
        leave_testbed(ray, actor)
        ray.kill(actor, no_restart=True)
        killed += 1
    remove_stale()  # cgroups of actors that died without leaving theirs (their creator pid is gone)
    shm_handoff.remove_stale()  # hand-over folders of actors that are gone
    return killed


def leave_testbed(ray, actor, timeout_s: float = 5.0) -> None:
    """Take a device actor out of its testbed cgroup (removing it) and remove its hand-over folder before it is
    killed: a killed process leaves both behind otherwise. Best effort: an actor that is gone or stuck is killed
    anyway (``remove_stale`` and ``shm_handoff.remove_stale`` sweep later)."""
    try:
        ray.get(actor.leave_host.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - gone, stuck or never on the testbed: remove_stale sweeps later
        pass
