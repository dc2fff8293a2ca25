"""The ``runtime`` config section: where a cluster's device stages run and how (RuntimeSpec)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.accelerator import Device
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.precision import Precision
from collapipe_flwr.spec_parsing import choices, require, typed
from collapipe_flwr.system.pipeline_model import Checkpoint, Schedule


class Backend(StrEnum):
    """``runtime.backend``: one Ray actor per device, or every stage in the CU's process."""

    RAY = "ray"
    LOCAL = "local"


class PinThreads(StrEnum):
    """``runtime.pin_threads`` (``executors.core_sets``): pin each device actor to its own cores when there are
    enough (auto), also round-robin with fewer (true), or never (false)."""

    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


class Handoff(StrEnum):
    """``runtime.handoff`` (pipeline/executors/shm_handoff.py): how activations and gradients move between the CU
    and its device actors; ``auto`` resolves to one of the other two."""

    AUTO = "auto"
    OBJECT_STORE = "object_store"
    SHM = "shm"


@dataclass(frozen=True)
class RuntimeSpec:
    """backend: ``ray`` (one Ray actor per device) | ``local`` (stages in the CU's process);
    ray_address: an existing Ray cluster ("auto" or host:port), "" = a local Ray instance;
    emulate: slow each device actor in proportion to its profile (f_k, phi_k);
    actor_num_cpus: Ray CPUs per device actor (0 lets actors schedule inside a Flower simulation);
    concurrent_cus: simulation only (``collapipe run`` and sweeps): how many CUs Flower's Ray backend trains at
    once. Each SuperNode claims one Ray CPU, and this is the CPU count Ray is started with (Flower's
    ``init-args-num-cpus``); 0 = the machine's cores (two of three CUs at a time on 2 cores), or all N with
    ``federation.decoder_update: joint`` or ``ordered`` (its barrier / turnstile waits for every CU). N trains
    every CU at once, as in a deployment (they then share the cores);
    device_timeout_s: the longest wait for one device's step; torch_threads: torch threads per process;
    server_threads: torch threads of the server's process while rounds train (its decoder / head steps): 1 by
    default, because in a simulation the server shares the cores with the device actors, which Ray runs at a
    lower priority (nice 15): a head on 2 threads of a 2-core machine took both cores and left a device actor 5-9%
    of its speed for a 26-34% faster head (benchmarks/server_threads.py); 0 = torch's default (every core: a server
    on its own machine, docs/deployment.md). The evaluation between rounds, when no CU trains, uses every usable
    core either way;
    precision: ``auto`` (bf16 autocast where the hardware has native bf16) | ``fp32`` | ``bf16``;
    device_resource: a Ray custom resource that pins device k's actor to device k's box: ``{k}`` replaced by
    k, or k appended when the name has no ``{k}`` (``device_`` and ``device_{k}`` both give ``device_0`` for
    device 0, whose box then runs ``ray start --address CU:6379 --resources '{"device_0": 1}'``; the first
    form needs no quoting in a Hydra override); "" leaves placement to Ray's scheduler (one machine, a
    simulation);
    prestart_devices: start every device actor of a cluster with its first round (idle ones hold no
    blocks, and import the blocks' code in the background: ~130 MiB a process at BERT size), so a later plan
    that adds a device pays no process start-up or import inside its round;
    device: where each device stage computes, ``cpu`` | ``cuda`` | ``auto`` (cuda where the stage's process
    sees a GPU), resolved inside the stage's process (collapipe_flwr/accelerator.py);
    server_device: the same for the server's decoder / head and evaluation ("" = ``device``);
    actor_num_gpus: the GPU fraction Ray reserves per device actor when its device is a GPU (0.25: four
    stages share one GPU); 0 reserves none (every actor uses the first GPU it sees);
    pin_threads: ``auto`` (each device actor of a CU on its own cores when the CU's host has at least S;
    see ``executors.core_sets``) | ``true`` (also with fewer cores, round-robin) | ``false`` (no pinning,
    the default: a CU pins without seeing other CUs' actors, so CUs sharing a host, as in the simulation,
    could stack their actors on the same cores);
    seeded_dropout: every dropout mask drawn from the run's seed, the round, the cluster, the step, the micro-batch
    and the block (``pipeline/dropout_seed.py``), so the same seed gives the same masks in any process and for any
    split; the server's head too, per step (off: each process draws from its own generator);
    handoff: how activations and gradients move between the CU and its device actors (``executors/shm_handoff.py``):
    ``shm`` (through files in /dev/shm; every actor on the CU's host) | ``object_store`` (Ray's object store, any
    host) | ``auto`` (``shm`` where every actor runs on the CU's host, else ``object_store``);
    memory_cgroup: each device actor joins its own memory cgroup as it starts, idle (cgroup v1, root:
    ``testbed/memory_limit.py``), so the kernel counts what it allocates for its segment and the round reports
    that peak; the testbed's ``memory_limit`` sets gamma_k^max on it (the server turns this on with it). Without it
    a device reports its peak RSS above its RSS at start."""

    backend: Backend = Backend.RAY
    ray_address: str = ""
    emulate: bool = False
    actor_num_cpus: float = 0.0
    concurrent_cus: int = 0
    device_timeout_s: float = 300.0
    torch_threads: int = 1
    server_threads: int = 1
    precision: Precision = Precision.AUTO
    prestart_devices: bool = True
    device_resource: str = ""
    device: Device = Device.CPU
    server_device: Device | str = ""  # "" = device
    actor_num_gpus: float = 0.0
    pin_threads: PinThreads = PinThreads.FALSE
    seeded_dropout: bool = False
    handoff: Handoff = Handoff.AUTO
    memory_cgroup: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "pin_threads", str(self.pin_threads).lower())  # YAML reads true/false as bools
        options = {"precision": Precision, "handoff": Handoff, "backend": Backend, "device": Device}
        choices(self, "runtime", **options, pin_threads=PinThreads)
        object.__setattr__(self, "server_device", _server_device(self.server_device))
        require(self.actor_num_cpus >= 0, "runtime.actor_num_cpus must be >= 0")
        require(
            self.concurrent_cus >= 0,
            f"runtime.concurrent_cus={self.concurrent_cus} must be >= 0 (0 = one CU per core)",
        )
        require(
            0 <= self.actor_num_gpus <= 1,
            f"runtime.actor_num_gpus={self.actor_num_gpus} must be in [0, 1] (a GPU fraction per device actor)",
        )
        require(self.device_timeout_s > 0, "runtime.device_timeout_s must be > 0")
        require(self.torch_threads >= 1, "runtime.torch_threads must be >= 1")
        require(
            self.server_threads >= 0,
            f"runtime.server_threads={self.server_threads} must be >= 0 (0 = every core of the server's machine)",
        )
        require(
            not self.device_resource or self.device_resource.replace("{k}", "0").replace("_", "a").isalnum(),
            f"runtime.device_resource={self.device_resource!r} must be a resource name of letters, digits and _ "
            "(the device index appended, or put where {k} is), e.g. device_",
        )

    @property
    def head_device(self) -> Device:
        """The server's decoder / head device setting (``server_device``, else ``device``)."""
        return Device(self.server_device or self.device)

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


def _server_device(value: object) -> Device | str:
    """``runtime.server_device`` as its Device, or "" (also for a null) when it follows ``runtime.device``."""
    if value is None or value == "":
        return ""
    try:
        return Device(str(value))
    except ValueError:
        raise ConfigError(
            f"runtime.server_device={value!r} must be one of {', '.join(Device)} (or empty: runtime.device)"
        ) from None


def parse_runtime(raw: Any) -> RuntimeSpec:
    """conf ``runtime`` mapping -> RuntimeSpec (one-line ConfigError on a bad key or value)."""
    return typed("runtime", RuntimeSpec, raw)


@dataclass(frozen=True)
class ClusterRuntime:
    """Everything that says where and how one cluster's device stages run, handed as one object from the config
    to the stages (``wiring.build_pipeline`` -> ``ClusterPipeline`` -> ``executors.open_stages`` -> the backend):
    the run's ``runtime`` section (:class:`RuntimeSpec`) and what belongs to this cluster alone.

    name: the prefix of this cluster's error messages (``cluster3``); actor_prefix: a non-empty prefix makes the
    device actors named and detached (``executors.ray_actor.actor_name``), so a later round or another process
    of the same CU finds them again; actor_threads: torch threads per device actor (None:
    ``executors.cores.default_actor_threads(S)``, or the size of the actor's core set when it is pinned);
    schedule: the stages' order in a step, ``gpipe`` | ``1f1b`` (the ``pipeline`` section's ``schedule``);
    checkpoint: the stages' re-materialization, ``never`` | ``except_last`` | ``always`` (``pipeline.checkpoint``,
    handed to each stage in its ``StageCompute``)."""

    spec: RuntimeSpec
    name: str = ""
    actor_prefix: str = ""
    actor_threads: int | None = None
    schedule: Schedule = Schedule.GPIPE
    checkpoint: Checkpoint = Checkpoint.NEVER

    def __post_init__(self) -> None:
        choices(self, "pipeline", schedule=Schedule, checkpoint=Checkpoint)

    @property
    def detached(self) -> bool:
        """Named device actors outlive the process that started them (a SuperNode runs a process per message)."""
        return bool(self.actor_prefix)


# A pipeline with no config at hand (tests, benchmarks): stages in this process, fp32, nothing started ahead.
LOCAL_RUNTIME = ClusterRuntime(RuntimeSpec(backend=Backend.LOCAL, precision=Precision.FP32, prestart_devices=False))
