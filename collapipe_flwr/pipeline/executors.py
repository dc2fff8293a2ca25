"""Where the stages run: in this process (``LocalStages``) or one Ray actor per device (``RayStages``).

The CU's driver (``cluster.py``) is backend-neutral: everything it does with a device goes through the
:class:`Stages` interface below, so only this module knows Ray. ``put(value) -> handle`` and
``submit(stage, method, *args) -> handle`` give handles, ``get(handle, stage) -> value`` waits for one.
A handle may be passed as an argument of a later ``submit``: locally it is the value itself, on Ray an
ObjectRef, so stage k+1 starts on micro-batch i as soon as stage k finishes it, without a round trip
through the CU, while stage k goes on with micro-batch i+1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from collapipe_flwr.errors import ConfigError, DeviceFailure
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import PIN_MODES
from collapipe_flwr.pipeline.stage import Stage
from collapipe_flwr.testbed import remove_stale

if TYPE_CHECKING:
    from ray.actor import ActorHandle

START_TIMEOUT_S = 120.0
NAMESPACE = "collapipe"
# (device index k, segment or None = keep what the device holds, optimizer state, slowdown, first block index)
StageSpec = tuple[int, "nn.ModuleList | None", "dict | None", float, int]
BACKENDS = ("local", "ray")


class RemoteMethod(Protocol):
    """One method of a Ray actor handle: ``.remote(*args)`` starts it and answers an ObjectRef."""

    def remote(self, *args: Any) -> Any: ...


class DeviceActor(Protocol):
    """The Ray actor handle of a :class:`StageActor` as :class:`RayStages` uses it (Ray types a handle's
    methods dynamically, so this names the ones called here; ``getattr(handle, m).remote`` reaches the rest)."""

    load_segment: RemoteMethod
    layout: RemoteMethod
    ping: RemoteMethod
    pin: RemoteMethod
    _actor_id: Any


class Stages(Protocol):
    """What the CU's driver may do with the devices of one cluster, whatever the backend."""

    backend: str

    def place(self, specs: Sequence[StageSpec], free_others: bool = True) -> None:
        """Make stage s = device specs[s].k, loading each spec's segment (when not None) into it."""

    def start_idle(self, devices: Sequence[int]) -> None:
        """Have ``devices`` ready (holding no blocks) before a plan uses them."""

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""

    def call_device(self, k: int, method: str, *args) -> Any:
        """Call ``method`` on device k and wait for its answer."""

    def new_step(self) -> None:
        """Start a new batch of ``submit`` calls (failure reports name the first one not done)."""

    def put(self, value) -> Any:
        """A handle on ``value`` that later submits may take as an argument."""

    def submit(self, stage: int, method: str, *args) -> Any:
        """Start ``method`` on stage ``stage`` (arguments may be handles); return its handle."""

    def get(self, handle, stage: int) -> Any:
        """The value of ``handle`` (from stage ``stage``), waiting for it."""

    def pids(self) -> dict[int, int]:
        """{device k: OS pid of the process holding it}."""

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to hand an ``nbytes`` payload from device ``src`` to device ``dst`` on this backend's transport
        (through ``src``'s link throttle on the testbed)."""

    def forget(self, k: int) -> None:
        """Drop device k (it failed): stop it if it still runs; later placements never use it."""

    def shutdown(self) -> None:
        """Stop every device of this cluster."""


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset / container CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores_list() -> list[int]:
    """The CPU core numbers this process may run on (all of them where affinity is not available)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def default_actor_threads(S: int) -> int:
    """Torch threads per device actor: the usable cores minus one for the CU process, shared by the S
    actors, at least 1. Oversubscribing cores hurts torch's OpenMP pool far more than leaving one idle
    (see benchmarks/pipeline_overhead.py and its ``--actor-threads`` option)."""
    return max(1, (usable_cores() - 1) // max(1, S))


def core_sets(cores: Sequence[int], S: int, mode: str = "auto") -> list[tuple[int, ...]] | None:
    """The CPU cores each of the S device actors of one host is pinned to (``runtime.pin_threads``), or None.

    ``auto``: disjoint sets when there are at least S cores: the first core is left to the CU (which
    embeds, calls the head and steps the embedding while the devices work) when there are more than S,
    the rest split into S contiguous near-equal sets (the first sets one core larger when they do not
    divide evenly); with fewer cores than stages nothing is pinned. ``true``: as ``auto``, and with fewer
    cores than stages each actor still gets one core, round-robin (so two actors share it). ``false``:
    None (the OS schedules every thread anywhere)."""
    if mode not in PIN_MODES:
        raise ConfigError(f"runtime.pin_threads={mode!r} must be one of {', '.join(PIN_MODES)}")
    cores = sorted(cores)
    C = len(cores)
    if mode == "false" or S < 1 or C == 0 or (C < S and mode == "auto"):
        return None
    if C < S:
        return [(cores[s % C],) for s in range(S)]
    rest = cores[1:] if C > S else cores
    size, extra = divmod(len(rest), S)
    sets, a = [], 0
    for s in range(S):
        b = a + size + (1 if s < extra else 0)
        sets.append(tuple(rest[a:b]))
        a = b
    return sets


def open_stages(
    backend: str,
    optimizer: OptimizerSpec,
    *,
    precision: str = "fp32",
    device: str = "cpu",
    num_gpus: float = 0.0,
    num_devices: int = 0,
    segments: int = 1,
    address: str | None = None,
    num_cpus: float = 0.0,
    device_resource: str = "",
    threads: int | None = None,
    timeout_s: float = 300.0,
    name: str = "",
    prefix: str = "",
    detached: bool = False,
    pin: str = "false",
) -> Stages:
    """The (empty) stages of one cluster on ``backend``; the Ray-only options are ignored locally.
    ``threads`` (torch threads per actor) defaults to ``default_actor_threads(segments)``, or to the size
    of the actor's core set when ``pin`` (runtime.pin_threads) pins it (:func:`core_sets`); ``device``
    (runtime.device) is resolved by each stage in its own process, ``num_gpus`` (runtime.actor_num_gpus) is
    the GPU fraction Ray reserves per actor when that device is not cpu."""
    if backend == "local":
        return LocalStages([], optimizer, precision=precision, device=device)
    if backend == "ray":
        return RayStages(
            [],
            optimizer,
            address=address,
            num_cpus=num_cpus,
            device_resource=device_resource,
            threads=threads or default_actor_threads(segments),
            fixed_threads=threads is not None,
            pin=pin,
            timeout_s=timeout_s,
            name=name,
            prefix=prefix,
            detached=detached,
            precision=precision,
            device=device,
            num_gpus=num_gpus,
            num_devices=num_devices,
        )
    raise ConfigError(f"runtime.backend={backend!r} must be one of {', '.join(BACKENDS)}")


def actor_name(prefix: str, k: int) -> str:
    """The Ray name of device k's actor for one cluster of one run (``prefix`` = run and cluster)."""
    return f"{prefix}.device{k}"


class LocalStages:
    """Stages as plain objects in this process, one per device index k; calls run immediately, in
    submission order. Like :class:`RayStages` the device objects outlive a repartition (:meth:`place`)."""

    backend = "local"

    def __init__(
        self, specs: Sequence[StageSpec], optimizer: OptimizerSpec, precision: str = "fp32", device: str = "cpu"
    ) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.device = device
        self.devices: dict[int, Stage] = {}
        self.place(specs)

    def place(self, specs: Sequence[StageSpec], free_others: bool = True) -> None:
        """Make stage s = device specs[s].k; a spec's segment (if not None) replaces what the device held;
        with ``free_others`` a device outside ``specs`` drops its blocks."""
        for k, segment, state, slowdown, offset in specs:
            if k not in self.devices:
                self.devices[k] = Stage(  # a new device with no segment starts idle, as on Ray
                    k,
                    segment if segment is not None else nn.ModuleList(),
                    self.optimizer,
                    optimizer_state=state,
                    slowdown=slowdown,
                    offset=offset,
                    precision=self.precision,
                    device=self.device,
                )
            elif segment is not None:
                self.devices[k].load_segment(segment, state, slowdown, offset)
        self.device_indices = [spec[0] for spec in specs]
        self.stages = [self.devices[k] for k in self.device_indices]
        for k, stage in self.devices.items():  # a device the plan leaves idle frees its blocks
            if free_others and specs and k not in self.device_indices and len(stage.segment):
                stage.load_segment(nn.ModuleList(), None, 1.0, 0)

    def start_idle(self, devices: Sequence[int]) -> None:
        """Nothing to start: a device object here costs no process start-up when a plan first uses it."""

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""
        return {k: stage.layout() for k, stage in self.devices.items()}

    def call_device(self, k: int, method: str, *args):
        return getattr(self.devices[k], method)(*args)

    def new_step(self) -> None:
        pass

    def submit(self, stage: int, method: str, *args):
        return getattr(self.stages[stage], method)(*args)

    def put(self, value):
        """A value later submits may take as an argument (here: the value itself)."""
        return value

    def get(self, handle, stage: int):
        """The value of ``handle`` (here: the handle itself; the call already ran)."""
        return handle

    def pids(self) -> dict[int, int]:
        return {k: os.getpid() for k in self.devices}

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        start = time.perf_counter()
        self.devices[dst].receive_payload(self.devices[src].send_payload(nbytes))
        return time.perf_counter() - start

    def forget(self, k: int) -> None:
        self.devices.pop(k, None)

    def shutdown(self) -> None:
        self.stages = []
        self.devices = {}


class StageActor(Stage):
    """A :class:`Stage` inside a Ray actor, with its own torch thread count and (optionally) CPU cores."""

    def __init__(self, threads: int, *args, **kwargs) -> None:
        self._all_cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        torch.set_num_threads(max(1, int(threads)))
        super().__init__(*args, **kwargs)

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

    def pid(self) -> int:
        return os.getpid()


_REMOTE_STAGE = None


def _remote_stage_class():
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
        ray.init(**kwargs)


def creation_error(err: BaseException) -> str:
    """The last ``...Error: message`` line of a Ray actor's creation failure ("" when there is none): e.g. a
    ConfigError raised in the actor's constructor (runtime.device=cuda on a box without a GPU)."""
    for line in reversed(str(err).splitlines()):
        if "Error: " in line:
            return line.strip()
    return ""


def device_resources(pattern: str, k: int) -> dict[str, Any]:
    """Ray actor options that pin device k's actor to the node offering the custom resource
    ``pattern.format(k=k)`` (runtime.device_resource); {} = Ray's default scheduling."""
    return {"resources": {pattern.format(k=k): 1.0}} if pattern else {}


class RayStages:
    """One Ray actor per device holding its segment and optimizer (``num_cpus=actor_num_cpus``).

    With a ``prefix`` (run and cluster), device k's actor is the named actor ``actor_name(prefix, k)`` in
    namespace ``collapipe``: a later round, or another process of the same CU (Flower's simulation runs a
    CU's messages on any worker of its pool; a deployed SuperNode starts one ClientApp process per message),
    finds the same live actor by name instead of starting a new one. ``detached`` actors outlive the process
    that created them (needed when that process ends after each message); :func:`release` kills them.
    """

    backend = "ray"

    def __init__(
        self,
        specs: Sequence[StageSpec],
        optimizer: OptimizerSpec,
        *,
        address: str | None = None,
        num_cpus: float = 0.0,
        device_resource: str = "",
        threads: int = 1,
        fixed_threads: bool = False,
        pin: str = "false",
        timeout_s: float = 300.0,
        name: str = "",
        prefix: str = "",
        detached: bool = False,
        precision: str = "fp32",
        device: str = "cpu",
        num_gpus: float = 0.0,
        num_devices: int = 0,
    ) -> None:
        import ray

        ensure_ray(address)
        self._ray = ray
        self.optimizer = optimizer
        self.timeout_s = float(timeout_s)
        self.where = f"{name}: " if name else ""
        self.num_cpus = float(num_cpus)
        self.device_resource = device_resource
        self.threads = int(threads)
        self.fixed_threads = bool(fixed_threads)
        self.pin_mode = pin
        core_sets([], 1, pin)  # a bad mode fails here, before any actor starts
        self.prefix = prefix
        self.detached = bool(detached)
        self.precision = precision
        self.device = device
        self.num_gpus = float(num_gpus) if device != "cpu" else 0.0
        self.devices: dict[int, DeviceActor] = {}
        self._submitted: list[tuple[Any, int]] = []  # (ObjectRef, stage)
        self.num_devices = max(num_devices, 1 + max((spec[0] for spec in specs), default=0))
        self._discover()
        self.place(specs)

    def _discover(self) -> None:
        """Adopt the live named actors of this cluster that this process does not know yet (another process
        of the same CU may have started them since)."""
        if not self.prefix:
            return
        for k in range(self.num_devices):
            if k not in self.devices:
                try:
                    actor = self._ray.get_actor(actor_name(self.prefix, k), namespace=NAMESPACE)
                    self.devices[k] = cast(DeviceActor, actor)
                except ValueError:
                    pass

    def place(self, specs: Sequence[StageSpec], free_others: bool = True, pin: bool = True) -> None:
        """Make stage s = device specs[s].k: start the actors not yet alive, load a spec's segment (if not
        None) into its live actor; devices outside ``specs`` stay alive (a later plan may use them) and,
        with ``free_others``, drop the blocks they held; with ``pin``, give the S stages their cores
        (:meth:`pin_stages`)."""
        ray = self._ray
        cls = _remote_stage_class()
        started, loads = [], []
        for k, segment, state, slowdown, offset in specs:
            if k not in self.devices:
                options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_restarts": 0}
                if self.num_gpus:
                    options["num_gpus"] = self.num_gpus
                options.update(device_resources(self.device_resource, k))
                if self.prefix:
                    options.update(name=actor_name(self.prefix, k), namespace=NAMESPACE, get_if_exists=True)
                    if self.detached:
                        options["lifetime"] = "detached"
                self.devices[k] = cls.options(**options).remote(
                    self.threads,
                    k,
                    segment if segment is not None else torch.nn.ModuleList(),
                    self.optimizer,
                    optimizer_state=state,
                    slowdown=slowdown,
                    offset=offset,
                    precision=self.precision,
                    device=self.device,
                    host_io=True,
                )
                started.append(k)
            if segment is not None:
                loads.append((k, self.devices[k].load_segment.remote(segment, state, slowdown, offset)))
        used = {spec[0] for spec in specs}
        for k, actor in self.devices.items():  # a device the plan leaves idle frees its blocks (empty segment)
            if free_others and specs and k not in used and k not in started:
                loads.append((k, actor.load_segment.remote(nn.ModuleList(), None, 1.0, 0)))
        self.device_indices = [spec[0] for spec in specs]
        self.actors = [self.devices[k] for k in self.device_indices]
        # Fail here, with the device named, if an actor cannot start (no resources, import error). Starting
        # a worker process (torch + transformers imports) takes seconds, so this wait has its own limit.
        start_timeout = max(self.timeout_s, START_TIMEOUT_S)
        for k, ref in [(k, self.devices[k].ping.remote()) for k in started] + loads:
            try:
                ray.get(ref, timeout=start_timeout)
            except ray.exceptions.GetTimeoutError:
                self.shutdown()
                raise DeviceFailure(
                    f"{self.where}device {k}'s Ray actor did not start within {start_timeout:g}s; "
                    "check the Ray cluster has room for it (runtime.actor_num_cpus) and that the device is up (with "
                    "runtime.device_resource, that a node offers its resource)",
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
        if pin and self.actors and self.pin_mode != "false":
            self.pin_stages()

    def pin_stages(self) -> dict[int, list[int]]:
        """Pin stage s's actor to ``core_sets(this host's cores, S, runtime.pin_threads)[s]`` with as many
        torch threads (unless ``threads`` was given), or unpin it; actors on another node (a deployment with
        ``device_resource``) are left on their own cores. Returns {device k: the cores it runs on}."""
        sets = None if self.device_resource else core_sets(usable_cores_list(), len(self.actors), self.pin_mode)
        node = self._ray.get_runtime_context().get_node_id()
        refs = []
        for s, actor in enumerate(self.actors):
            cores = sets[s] if sets else None
            threads = self.threads if self.fixed_threads or not cores else len(cores)
            refs.append((self.device_indices[s], actor.pin.remote(cores, threads, node)))
        return {k: self._get_device(ref, k) for k, ref in refs}

    def start_idle(self, devices: Sequence[int]) -> None:
        """Start the actors of ``devices`` that are not alive yet, holding no blocks, so a later plan that
        uses them pays no process start-up in its round."""
        idle = [(k, torch.nn.ModuleList(), None, 1.0, 0) for k in devices if k not in self.devices]
        if idle:
            keep = (list(self.device_indices), list(self.actors))
            self.place(idle, free_others=False, pin=False)
            self.device_indices, self.actors = keep

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""
        self._discover()
        refs = {k: actor.layout.remote() for k, actor in self.devices.items()}
        return {k: tuple(self._get_device(ref, k)) for k, ref in refs.items()}

    def call_device(self, k: int, method: str, *args):
        return self._get_device(getattr(self.devices[k], method).remote(*args), k)

    def _get_device(self, ref, k: int):
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except (self._ray.exceptions.GetTimeoutError, self._ray.exceptions.RayActorError):
            raise DeviceFailure(
                f"{self.where}device {k} gave no answer (its Ray actor is gone or stuck); re-plan the cluster without "
                "it",
                device=k,
            ) from None

    def forget(self, k: int) -> None:
        """Drop device k's actor (it failed): killed if Ray still reaches it, never used again."""
        actor = self.devices.pop(k, None)
        if actor is not None:
            try:
                self._ray.kill(cast(Any, actor), no_restart=True)
            except Exception:  # noqa: BLE001 - already gone: nothing to stop
                pass

    def pids(self) -> dict[int, int]:
        """{device k: the OS pid of its actor process} (tests check actors are reused across rounds)."""
        return {k: self.call_device(k, "pid") for k in self.devices}

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        """Device ``src`` makes the payload and hands it on through its link; device ``dst`` takes it from Ray's
        object store, as stage k+1 takes stage k's activation (no round trip through the CU)."""
        start = time.perf_counter()
        sent = cast(Any, self.devices[src]).send_payload.remote(nbytes)
        ref = cast(Any, self.devices[dst]).receive_payload.remote(sent)
        self._get_device(ref, dst)
        return time.perf_counter() - start

    def put(self, value):
        """Put ``value`` in Ray's object store once; stages read it without another copy through the CU."""
        return self._ray.put(value)

    def new_step(self) -> None:
        self._submitted = []

    def submit(self, stage: int, method: str, *args):
        ref = getattr(self.actors[stage], method).remote(*args)
        self._submitted.append((ref, stage))
        return ref

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
            return ray.get(handle, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            stage = self._stuck_stage(stage)
            raise DeviceFailure(
                f"{self.where}device {self.device_indices[stage]} gave no answer within "
                f"device_timeout_s={self.timeout_s:g}s; check that device or raise runtime.device_timeout_s",
                device=self.device_indices[stage],
            ) from None
        except ray.exceptions.RayActorError as err:
            dead = self._dead_device(err, stage)
            raise DeviceFailure(
                f"{self.where}device {dead} died during the step (its Ray actor is gone); re-plan the cluster "
                "without it",
                device=dead,
            ) from None
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, ray.exceptions.RayActorError):
                dead = self._dead_device(cause, stage)
                raise DeviceFailure(
                    f"{self.where}device {dead} died during the step (its Ray actor is gone); re-plan the cluster "
                    "without it",
                    device=dead,
                ) from None
            raise err.as_instanceof_cause() from None

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
            _leave_testbed(self._ray, actor)
            try:
                self._ray.kill(cast("ActorHandle", actor), no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.devices = {}
        self.actors = []


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
        _leave_testbed(ray, actor)
        ray.kill(actor, no_restart=True)
        killed += 1
    remove_stale()  # cgroups of actors that died without leaving theirs (their creator pid is gone)
    return killed


def _leave_testbed(ray, actor, timeout_s: float = 5.0) -> None:
    """Take a device actor out of its testbed cgroup (removing it) before it is killed: a killed process leaves
    its cgroup behind otherwise. Best effort: an actor that is gone or stuck is killed anyway."""
    try:
        ray.get(actor.clear_testbed.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - gone, stuck or never on the testbed: remove_stale sweeps later
        pass
