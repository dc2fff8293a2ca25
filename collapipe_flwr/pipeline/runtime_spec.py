"""The ``runtime`` config section: where a cluster's device stages run and how (RuntimeSpec)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from collapipe_flwr.accelerator import DEVICES
from collapipe_flwr.precision import PRECISIONS
from collapipe_flwr.spec_parsing import require, typed

BACKENDS = ("ray", "local")
PIN_MODES = ("auto", "true", "false")
HANDOFFS = ("auto", "object_store", "shm")  # runtime.handoff (pipeline/executors/shm_handoff.py)


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

    backend: str = "ray"
    ray_address: str = ""
    emulate: bool = False
    actor_num_cpus: float = 0.0
    concurrent_cus: int = 0
    device_timeout_s: float = 300.0
    torch_threads: int = 1
    server_threads: int = 1
    precision: str = "auto"
    prestart_devices: bool = True
    device_resource: str = ""
    device: str = "cpu"
    server_device: str = ""
    actor_num_gpus: float = 0.0
    pin_threads: str = "false"
    seeded_dropout: bool = False
    handoff: str = "auto"
    memory_cgroup: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "pin_threads", str(self.pin_threads).lower())  # YAML reads true/false as bools
        require(
            self.precision in PRECISIONS, f"runtime.precision={self.precision!r} must be one of {', '.join(PRECISIONS)}"
        )
        require(self.handoff in HANDOFFS, f"runtime.handoff={self.handoff!r} must be one of {', '.join(HANDOFFS)}")
        require(self.backend in BACKENDS, f"runtime.backend={self.backend!r} must be one of {', '.join(BACKENDS)}")
        require(self.actor_num_cpus >= 0, "runtime.actor_num_cpus must be >= 0")
        require(
            self.concurrent_cus >= 0,
            f"runtime.concurrent_cus={self.concurrent_cus} must be >= 0 (0 = one CU per core)",
        )
        require(self.device in DEVICES, f"runtime.device={self.device!r} must be one of {', '.join(DEVICES)}")
        require(
            self.server_device in ("", *DEVICES),
            f"runtime.server_device={self.server_device!r} must be one of {', '.join(DEVICES)} "
            "(or empty: runtime.device)",
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
            self.pin_threads in PIN_MODES,
            f"runtime.pin_threads={self.pin_threads!r} must be one of {', '.join(PIN_MODES)}",
        )
        require(
            not self.device_resource or self.device_resource.replace("{k}", "0").replace("_", "a").isalnum(),
            f"runtime.device_resource={self.device_resource!r} must be a resource name of letters, digits and _ "
            "(the device index appended, or put where {k} is), e.g. device_",
        )

    @property
    def head_device(self) -> str:
        """The server's decoder / head device setting (``server_device``, else ``device``)."""
        return self.server_device or self.device

    def to_raw(self) -> dict[str, Any]:
        return asdict(self)


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
    schedule: the stages' order in a step, ``gpipe`` | ``1f1b`` (the ``pipeline`` section's ``schedule``)."""

    spec: RuntimeSpec
    name: str = ""
    actor_prefix: str = ""
    actor_threads: int | None = None
    schedule: str = "gpipe"

    @property
    def detached(self) -> bool:
        """Named device actors outlive the process that started them (a SuperNode runs a process per message)."""
        return bool(self.actor_prefix)


# A pipeline with no config at hand (tests, benchmarks): stages in this process, fp32, nothing started ahead.
LOCAL_RUNTIME = ClusterRuntime(RuntimeSpec(backend="local", precision="fp32", prestart_devices=False))
