"""The stages of one cluster as one Ray actor per device (``runtime.backend: ray``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from collapipe_flwr.accelerator import Device
from collapipe_flwr.errors import ConfigError, DeviceFailure
from collapipe_flwr.pipeline.executors import shm_handoff
from collapipe_flwr.pipeline.executors.cores import core_sets, default_actor_threads, usable_cores_list
from collapipe_flwr.pipeline.executors.interface import StageSpec
from collapipe_flwr.pipeline.executors.ray_actor import (
    NAMESPACE,
    DeviceActor,
    actor_name,
    creation_error,
    device_resources,
    ensure_ray,
    leave_testbed,
    remote_stage_class,
)
from collapipe_flwr.pipeline.executors.ray_calls import RayStageCalls
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import ClusterRuntime, Handoff, PinThreads
from collapipe_flwr.pipeline.stage import StageCompute
from collapipe_flwr.testbed.memory_limit import oom_kills_at
from collapipe_flwr.testbed.memory_limit import remove_path as remove_memory_cgroup

if TYPE_CHECKING:
    from ray.actor import ActorHandle

START_TIMEOUT_S = 120.0


class RayStages(RayStageCalls):
    """One Ray actor per device holding its segment and optimizer (module docstring). Everything about where
    and how the actors run comes from ``runtime`` (:class:`~collapipe_flwr.pipeline.runtime_spec.ClusterRuntime`):
    ``ray_address``, ``actor_num_cpus``, ``actor_num_gpus`` (reserved only when ``device`` is not cpu),
    ``device_resource``, ``pin_threads``, ``device_timeout_s``, ``precision``, ``device``; the cluster's ``name``,
    ``actor_prefix`` and ``actor_threads``. The typed stage and device calls of the protocol come from
    :class:`~collapipe_flwr.pipeline.executors.ray_calls.RayStageCalls`."""

    backend = "ray"

    def __init__(
        self,
        specs: Sequence[StageSpec],
        optimizer: OptimizerSpec,
        runtime: ClusterRuntime,
        *,
        num_devices: int = 0,
        segments: int = 1,
    ) -> None:
        import ray

        rt = runtime.spec
        ensure_ray(rt.ray_address or None)
        self._ray = ray
        self.optimizer = optimizer
        self.runtime = runtime
        self.timeout_s = float(rt.device_timeout_s)
        self.where = f"{runtime.name}: " if runtime.name else ""
        self.threads = int(runtime.actor_threads or default_actor_threads(segments))
        self.fixed_threads = runtime.actor_threads is not None
        core_sets([], 1, rt.pin_threads)  # a bad mode fails here, before any actor starts
        self.num_gpus = float(rt.actor_num_gpus) if rt.device is not Device.CPU else 0.0
        self.devices: dict[int, DeviceActor] = {}
        self.memory_paths: dict[int, str] = {}  # device k -> its memory cgroup (runtime.memory_cgroup), for OOM kills
        self._submitted: list[tuple[Any, int]] = []  # (ObjectRef, stage)
        self.idle_losses: list[DeviceFailure] = []  # idle devices found dead since the last take (processes())
        self.handoff = Handoff.OBJECT_STORE  # until place() has seen where the actors run (runtime.handoff)
        self._told: dict[int, tuple[str, str]] = {}  # device k -> (its node, the hand-over it was told)
        self._parking = shm_handoff.ParkingLot(tag=uuid.uuid4().hex[:8])  # this pipeline's own tensors (CU side)
        shm_handoff.remove_stale()  # what processes of an earlier run that crashed left unread
        self.num_devices = max(num_devices, 1 + max((spec.device for spec in specs), default=0))
        self._discover()
        self.place(specs)

    def _discover(self) -> None:
        """Adopt the live named actors of this cluster that this process does not know yet (another process
        of the same CU may have started them since)."""
        if not self.runtime.actor_prefix:
            return
        for k in range(self.num_devices):
            if k not in self.devices:
                try:
                    actor = self._ray.get_actor(actor_name(self.runtime.actor_prefix, k), namespace=NAMESPACE)
                    self.devices[k] = cast(DeviceActor, actor)
                except ValueError:
                    continue
                self._learn_memory_paths([k])

    def place(self, specs: Sequence[StageSpec], free_others: bool = True, pin: bool = True) -> None:
        """Make stage s = device specs[s].device: start the actors not yet alive, load a spec's segment (if not
        None) into its live actor; devices outside ``specs`` stay alive (a later plan may use them) and,
        with ``free_others``, drop the blocks they held; with ``pin``, give the S stages their cores
        (:meth:`pin_stages`)."""
        started = [spec.device for spec in specs if spec.device not in self.devices]
        for k in started:  # started empty: each segment then goes once, by a load (shared memory where it can)
            self.devices[k] = self._start_actor(k)
        if started:  # where the new actors run decides the hand-over before any segment travels
            self._wait_started([(k, self.devices[k].ping.remote()) for k in started])
            self._learn_memory_paths(started)
            self._set_handoff()
        loads = [(spec.device, self._load(spec, spec.segment)) for spec in specs if spec.segment is not None]
        used = {spec.device for spec in specs}
        for k, actor in self.devices.items():  # a device the plan leaves idle frees its blocks (empty segment)
            if free_others and specs and k not in used and k not in started:
                loads.append((k, actor.load_segment.remote(nn.ModuleList(), None, 1.0, 0)))
        self.device_indices = [spec.device for spec in specs]
        self.actors = [self.devices[k] for k in self.device_indices]
        self._wait_started(loads)
        self._set_handoff()
        if pin and self.actors and self.runtime.spec.pin_threads is not PinThreads.FALSE:
            self.pin_stages()

    def _load(self, spec: StageSpec, segment: nn.Module) -> Any:
        """Start loading ``segment`` (``spec``'s, not None) into device k's live actor (the spec's fields travel as
        the arguments of ``Stage.load_segment``). Once the hand-over is shared memory, the blocks' weights and the
        optimizer state take it too (``shm_handoff.parked_module``): through Ray's object store their pages would
        stay mapped into the device, memory it seems to hold round after round."""
        actor = self.devices[spec.device]
        state, slowdown, offset = spec.optimizer_state, spec.slowdown, spec.offset
        parked = shm_handoff.parked_module(segment, self._parking) if self.handoff is Handoff.SHM else None
        if parked is None:
            return actor.load_segment.remote(segment, state, slowdown, offset)
        skeleton, weights = parked
        return actor.load_segment.remote(skeleton, self._tree(state), slowdown, offset, weights)

    def _learn_memory_paths(self, devices: Sequence[int]) -> None:
        """Where the memory cgroups of ``devices`` are (``runtime.memory_cgroup``), read while they live, so the
        kernel's OOM-kill count can be read once one dies (:meth:`_death_cause`)."""
        if not self.runtime.spec.memory_cgroup or not devices:
            return
        paths = self._get_all([(k, self.devices[k].memory_cgroup_path.remote()) for k in devices])
        self.memory_paths.update({k: str(p) for k, p in zip(devices, paths) if p})

    def _death_cause(self, k: int) -> tuple[str, str]:
        """(why device k's process died, its reason code): ``memory`` when its memory cgroup counts an OOM kill
        (the kernel killed it over gamma_k^max); the cgroup it left behind is then removed."""
        path = self.memory_paths.pop(k, "")
        if not path or oom_kills_at(path) == 0:
            return "", ""
        remove_memory_cgroup(path)
        return (
            "the kernel killed it for memory: it needed more than its cgroup limit gamma_k^max (C7); "
            "the planner's memory model is corrected from the measured peaks",
            "memory",
        )

    def _set_handoff(self) -> None:
        """Choose how tensors move between this CU and its actors (``runtime.handoff``, ``shm_handoff.choose``)
        from the nodes the actors run on, and tell every actor whose mode changes."""
        mode = self.runtime.spec.handoff
        if mode is Handoff.OBJECT_STORE or not self.devices:
            return
        ray = self._ray
        unknown = [k for k in self.devices if k not in self._told]
        nodes = dict(zip(unknown, self._get_all([(k, self.devices[k].node_id.remote()) for k in unknown])))
        nodes.update({k: told[0] for k, told in self._told.items() if k in self.devices})
        try:
            here = ray.get_runtime_context().get_node_id()
            chosen = shm_handoff.choose(mode, here, [nodes[k] for k in sorted(nodes)], shm_handoff.available())
        except ValueError as err:
            raise ConfigError(f"{self.where}{err}") from None
        changed = [k for k in sorted(nodes) if self._told.get(k, ("", ""))[1] != chosen]
        self._get_all([(k, self.devices[k].set_handoff.remote(chosen)) for k in changed])
        self._told = {k: (nodes[k], chosen) for k in nodes}
        self.handoff = chosen

    def _get_all(self, refs: list[tuple[int, Any]]) -> list[Any]:
        """The answers of one call per device, each device named if it fails or gives no answer."""
        return [self._get_device(ref, k) for k, ref in refs]

    def _actor_options(self, k: int) -> dict[str, Any]:
        """Ray options of device k's actor: its CPUs / GPU fraction, its node (``device_resource``), its name."""
        rt = self.runtime.spec
        options: dict[str, Any] = {"num_cpus": rt.actor_num_cpus, "max_restarts": 0}
        if self.num_gpus:
            options["num_gpus"] = self.num_gpus
        options.update(device_resources(rt.device_resource, k))
        if self.runtime.actor_prefix:
            options.update(name=actor_name(self.runtime.actor_prefix, k), namespace=NAMESPACE, get_if_exists=True)
            if self.runtime.detached:
                options["lifetime"] = "detached"
        return options

    def _start_actor(self, k: int) -> DeviceActor:
        """Start device k's actor holding no blocks (its segment comes by ``load_segment``, :meth:`place`)."""
        return (
            remote_stage_class()
            .options(**self._actor_options(k))
            .remote(
                self.threads,
                k,
                torch.nn.ModuleList(),
                self.optimizer,
                compute=StageCompute(
                    device=self.runtime.spec.device,
                    precision=self.runtime.spec.precision,
                    host_io=True,
                    checkpoint=self.runtime.checkpoint,
                ),
                memory_cgroup=f"dev{k}" if self.runtime.spec.memory_cgroup else "",
            )
        )

    def _wait_started(self, refs: list[tuple[int, Any]]) -> None:
        """Fail here, with the device named, if an actor cannot start (no resources, import error). Starting a
        worker process (torch + transformers imports) takes seconds, so this wait has its own limit."""
        ray = self._ray
        start_timeout = max(self.timeout_s, START_TIMEOUT_S)
        for k, ref in refs:
            try:
                ray.get(ref, timeout=start_timeout)
            except ray.exceptions.GetTimeoutError:
                rt_cpus = float(self.runtime.spec.actor_num_cpus)
                free_gpus = float(ray.available_resources().get("GPU", 0.0)) if self.num_gpus else 0.0
                self.shutdown()
                raise DeviceFailure(
                    f"{self.where}device {k}'s Ray actor did not start within {start_timeout:g}s; "
                    f"check the Ray cluster has room for it (runtime.actor_num_cpus={rt_cpus:g}"
                    + (f", runtime.actor_num_gpus={self.num_gpus:g}; GPUs free: {free_gpus:g}" if self.num_gpus else "")
                    + ") and that the device is up (with runtime.device_resource, that a node offers its resource)",
                    device=k,
                ) from None
            except ray.exceptions.RayActorError as err:
                self.shutdown()
                cause = creation_error(err)
                raise DeviceFailure(
                    f"{self.where}device {k}'s Ray actor failed to start"
                    + (f": {cause}" if cause else "; see the Ray worker log for the cause"),
                    device=k,
                ) from None

    def pin_stages(self) -> dict[int, list[int]]:
        """Pin stage s's actor to ``core_sets(this host's cores, S, runtime.pin_threads)[s]`` with as many
        torch threads (unless ``threads`` was given), or unpin it; actors on another node (a deployment with
        ``device_resource``) are left on their own cores. Returns {device k: the cores it runs on}."""
        rt = self.runtime.spec
        sets = None if rt.device_resource else core_sets(usable_cores_list(), len(self.actors), rt.pin_threads)
        node = self._ray.get_runtime_context().get_node_id()
        refs = []
        for s, actor in enumerate(self.actors):
            cores = sets[s] if sets else None
            threads = self.threads if self.fixed_threads or not cores else len(cores)
            refs.append((self.device_indices[s], actor.pin.remote(cores, threads, node)))
        return {k: self._get_device(ref, k) for k, ref in refs}

    def start_idle(self, devices: Sequence[int], warm_modules: Sequence[str] = ()) -> None:
        """Start the actors of ``devices`` that are not alive yet, holding no blocks, so a later plan that
        uses them pays no process start-up in its round; each then imports ``warm_modules`` (``Stage.warm_up``)
        without this CU waiting for it. Ray runs an actor's calls in order, so a segment sent later waits for
        the import at most, and a fresh device's first segment costs what a later move does."""
        idle = [StageSpec(k) for k in devices if k not in self.devices]
        if idle:
            keep = (list(self.device_indices), list(self.actors))
            self.place(idle, free_others=False, pin=False)
            self.device_indices, self.actors = keep
            if warm_modules:
                for spec in idle:
                    self.devices[spec.device].warm_up.remote(list(warm_modules))  # not awaited: a background import

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""
        self._discover()
        refs = {k: actor.layout.remote() for k, actor in self.devices.items()}
        return {k: tuple(self._get_device(ref, k)) for k, ref in refs.items()}

    def _get_device(self, ref, k: int):
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except (self._ray.exceptions.GetTimeoutError, self._ray.exceptions.RayActorError) as err:
            cause, reason = self._death_cause(k) if isinstance(err, self._ray.exceptions.RayActorError) else ("", "")
            if cause:
                raise DeviceFailure(f"{self.where}device {k} died: {cause}", device=k, reason=reason) from None
            raise DeviceFailure(
                f"{self.where}device {k} gave no answer (its Ray actor is gone or stuck); re-plan the cluster without "
                "it",
                device=k,
            ) from None

    def forget(self, k: int) -> None:
        """Drop device k's actor (it failed): killed if Ray still reaches it, never used again."""
        actor = self.devices.pop(k, None)
        self._told.pop(k, None)
        if actor is not None:
            try:
                self._ray.kill(cast(Any, actor), no_restart=True)
            except Exception:  # noqa: BLE001 - already gone: nothing to stop
                pass

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        """Device ``src`` makes the payload and hands it on through its link; device ``dst`` takes it the way
        stage k+1 takes stage k's activation (``runtime.handoff``: Ray's object store or shared memory)."""
        start = time.perf_counter()
        sent = self.devices[src].send_payload.remote(nbytes)
        ref = self.devices[dst].receive_payload.remote(sent)
        self._get_device(ref, dst)
        return time.perf_counter() - start

    def put(self, value):
        """A handle on ``value`` for later submits: a tensor under :data:`shm_handoff.PARK_MIN_BYTES` (a micro-batch's
        attention mask) as it is, inlined in each call as Ray inlines small arguments; anything larger put in Ray's
        object store once, so stages read it without another copy through the CU. A small put would cost a new
        object-store allocation per micro-batch, whose pages stay mapped into every device that read them (RssShmem:
        device memory that grows round after round, docs/testbed.md)."""
        if torch.is_tensor(value) and value.numel() * value.element_size() < shm_handoff.PARK_MIN_BYTES:
            return value
        return self._ray.put(value)

    def new_step(self) -> None:
        self._submitted = []
        if self.handoff is Handoff.SHM:
            self._parking.clear()  # what a failed step parked here and no actor read

    def _stuck_stage(self, default: int) -> int:
        """The stage of the earliest call (in submission, hence dependency, order) still not done."""
        for ref, stage in self._submitted:
            ready, _ = self._ray.wait([ref], timeout=0)
            if not ready:
                return stage
        return default

    def get(self, handle, stage: int):
        """The value of ``handle``; a device that died or gives no answer within ``timeout_s`` raises
        :class:`DeviceFailure` naming it."""
        ray = self._ray
        try:
            return shm_handoff.resolve_tree(ray.get(handle, timeout=self.timeout_s))
        except ray.exceptions.GetTimeoutError:
            stage = self._stuck_stage(stage)
            raise DeviceFailure(
                f"{self.where}device {self.device_indices[stage]} gave no answer within "
                f"device_timeout_s={self.timeout_s:g}s; check that device or raise runtime.device_timeout_s",
                device=self.device_indices[stage],
            ) from None
        except ray.exceptions.RayActorError as err:
            raise self._died(err, stage) from None
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, ray.exceptions.RayActorError):
                raise self._died(cause, stage) from None
            raise err.as_instanceof_cause() from None

    def _died(self, err, stage: int) -> DeviceFailure:
        """The failure of the device whose actor died during the step (named by ``_dead_device``)."""
        dead = self._dead_device(err, stage)
        cause, reason = self._death_cause(dead)
        if cause:
            return DeviceFailure(f"{self.where}device {dead} died during the step: {cause}", device=dead, reason=reason)
        return DeviceFailure(
            f"{self.where}device {dead} died during the step (its Ray actor is gone); re-plan the cluster without it",
            device=dead,
        )

    def _dead_device(self, err, stage: int) -> int:
        """The device whose actor died: by the error's actor id, else the first that does not answer."""
        actor_id = getattr(err, "actor_id", None)
        for s, actor in enumerate(self.actors):
            if actor_id is not None and actor._actor_id.hex() == actor_id:
                return self.device_indices[s]
        for s, actor in enumerate(self.actors):
            try:
                self._ray.get(actor.ping.remote(), timeout=min(5.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - any failure to answer marks the device
                return self.device_indices[s]
        return self.device_indices[stage]

    def kill(self, stage: int) -> None:
        """Kill one device's actor (fault-injection for tests and demos)."""
        self._ray.kill(cast("ActorHandle", self.actors[stage]), no_restart=True)

    def shutdown(self) -> None:
        """Kill every device actor of this pipeline (named ones included), each out of its testbed cgroup first."""
        for actor in getattr(self, "devices", {}).values():
            leave_testbed(self._ray, actor)
            try:
                self._ray.kill(cast("ActorHandle", actor), no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.devices = {}
        self.actors = []
        self._told = {}
        if hasattr(self, "_parking"):
            self._parking.remove()
        shm_handoff.remove_stale()
