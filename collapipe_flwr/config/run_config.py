"""The frozen config objects: :class:`RunConfig` (the server, the sweep, ``train_central``, ``simulate``) and
:class:`ClusterConfig` (the part a CU gets), each built once from a mapping by calling every section's parser."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from collapipe_flwr.accelerator import Device
from collapipe_flwr.config.data_dir import resolve_data_dir
from collapipe_flwr.config.hydra_conf import to_plain
from collapipe_flwr.config.privacy import PrivacyMode, PrivacySpec
from collapipe_flwr.config.round_adapters import RoundAdaptersSpec
from collapipe_flwr.config.sections import (
    DataPlaneSpec,
    DecoderUpdateMode,
    EmbeddingMode,
    EvalSpec,
    FederationSpec,
    PipelineSpec,
    parse_dataplane,
)
from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec, parse_method, parse_scheduler
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.runtime_spec import Backend, RuntimeSpec, parse_runtime
from collapipe_flwr.spec_parsing import check_keys, choice, mapping, require, scalar, typed
from collapipe_flwr.system.clock_spec import ClockSpec, parse_clock
from collapipe_flwr.system.measurement_spec import SystemSpec, TestbedSpec, parse_system, parse_testbed
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.pipeline_model import Schedule
from collapipe_flwr.tasks.spec import ModelSpec, TaskSpec, parse_model, parse_task


class FlowerLogLevel(StrEnum):
    """``flower_log``: the lowest level of Flower's own ServerApp log lines that is shown."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs, every section a typed spec parsed once by the package that owns it
    (:func:`build_run_config`)."""

    seed: int
    data_dir: str
    output_dir: str
    run_name: str
    task: TaskSpec
    model: ModelSpec
    method: MethodSpec
    scheduler: SchedulerSpec
    network: NetworkSpec
    federation: FederationSpec
    runtime: RuntimeSpec
    dataplane: DataPlaneSpec
    eval: EvalSpec
    save_client_weights: bool = False
    checkpoint: bool = True  # save the server's state after every round (fl/server/checkpoint.py)
    resume: bool = False  # continue the run in output_dir/run_name from its last checkpoint
    # Flower's own ServerApp log lines: "info" shows its round banners and dump
    flower_log: FlowerLogLevel = FlowerLogLevel.WARNING
    tensorboard: bool = False  # also log each round's scalars to <run folder>/tensorboard (needs tensorboard)
    system: SystemSpec = SystemSpec()  # where DSSRA's device and link numbers come from (config | measured)
    testbed: TestbedSpec = TestbedSpec()  # the emulated heterogeneous testbed (off unless testbed=emulated)
    privacy: PrivacySpec = PrivacySpec()  # differential privacy on the CUs' uploads (config/privacy.py)
    pipeline: PipelineSpec = PipelineSpec()  # the stages' schedule: gpipe | 1f1b
    clock: ClockSpec = ClockSpec()  # which clock the run's times are read on: wall | virtual
    round_adapters: RoundAdaptersSpec = RoundAdaptersSpec()  # a LoRA causal LM's adapters every k rounds

    def resolved_data_dir(self) -> Path:
        """``data_dir`` if set, else $COLLAPIPE_DATA_DIR; a one-line error when neither names a folder."""
        return resolve_data_dir(self.data_dir)

    def to_dict(self) -> dict:
        """The YAML-shaped mapping (``build_run_config(cfg.to_dict()) == cfg``): what config.json holds."""
        return {
            "seed": self.seed,
            "data_dir": self.data_dir,
            "output_dir": self.output_dir,
            "run_name": self.run_name,
            "task": self.task.to_raw(),
            "model": self.model.to_raw(),
            "method": self.method.to_raw(),
            "scheduler": self.scheduler.to_raw(),
            "network": self.network.to_raw(),
            "federation": dataclasses.asdict(self.federation),
            "runtime": self.runtime.to_raw(),
            "dataplane": dataclasses.asdict(self.dataplane),
            "eval": self.eval.to_raw(),
            "save_client_weights": self.save_client_weights,
            "checkpoint": self.checkpoint,
            "flower_log": self.flower_log,
            "tensorboard": self.tensorboard,
            "resume": self.resume,
            "system": self.system.to_raw(),
            "testbed": self.testbed.to_raw(),
            "privacy": dataclasses.asdict(self.privacy),
            "pipeline": self.pipeline.to_raw(),
            "clock": self.clock.to_raw(),
            # only when changed: the config.json of earlier runs stays the same (a resume compares them)
            **(
                {"round_adapters": dataclasses.asdict(self.round_adapters)}
                if self.round_adapters != RoundAdaptersSpec()
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        return build_run_config(data)

    def cluster_config(self) -> ClusterConfig:
        """The part of this config a CU uses: what the server sends in its hello and train messages."""
        runtime = self.runtime
        if self.testbed.enabled and self.testbed.memory_limit:  # C7 on the testbed: each device in a memory cgroup
            runtime = dataclasses.replace(runtime, memory_cgroup=True)
        return ClusterConfig(
            seed=self.seed,
            data_dir=self.data_dir,
            task=self.task,
            model=self.model,
            federation=self.federation,
            runtime=runtime,
            dataplane=self.dataplane,
            head_on_server=self.method.head_on_server,
            aggregated=self.method.aggregate,
            privacy=self.privacy,
            pipeline=self.pipeline,
        )


@dataclass(frozen=True)
class ClusterConfig:
    """What a CU needs of the run config (a CU never sees the scheduler, network, method or eval sections):
    the task and model, the federation's round / step counts, the runtime of its devices, the data plane's
    wire settings, whether the head is the server's (data plane) or its own (``method.head_on_server``), and
    whether the server averages what the CU trains (``method.aggregate``; False for the PipeLine baseline, whose
    weights then pass no emulated uplink: eq. (11) charges it z_enc only)."""

    seed: int
    data_dir: str
    task: TaskSpec
    model: ModelSpec
    federation: FederationSpec
    runtime: RuntimeSpec
    dataplane: DataPlaneSpec
    head_on_server: bool
    aggregated: bool = True
    privacy: PrivacySpec = PrivacySpec()
    pipeline: PipelineSpec = PipelineSpec()

    def to_dict(self) -> dict:
        """The JSON a CU receives (``build_cluster_config(cfg.to_dict()) == cfg``)."""
        return {
            "seed": self.seed,
            "data_dir": self.data_dir,
            "task": self.task.to_raw(),
            "model": self.model.to_raw(),
            "federation": dataclasses.asdict(self.federation),
            "runtime": self.runtime.to_raw(),
            "dataplane": dataclasses.asdict(self.dataplane),
            "head_on_server": self.head_on_server,
            "aggregated": self.aggregated,
            "privacy": dataclasses.asdict(self.privacy),
            "pipeline": self.pipeline.to_raw(),
        }

    def with_data_dir(self, data_dir: str) -> ClusterConfig:
        """This config reading its data from ``data_dir`` (the CU's own copy) when one is given."""
        return dataclasses.replace(self, data_dir=str(data_dir)) if data_dir else self


AnyConfig = RunConfig | ClusterConfig  # what the functions both sides use (task, model, runtime ...) accept


def build_cluster_config(data: Mapping[str, Any]) -> ClusterConfig:
    """The CU's side of :func:`build_run_config`: the same section parsers over the part the server sent."""
    data = mapping("cluster config", data)
    check_keys("cluster config", data, {f.name for f in dataclasses.fields(ClusterConfig)})
    seed = _seed(data)
    task = parse_task(data.get("task"))
    return ClusterConfig(
        seed=seed,
        data_dir=str(data.get("data_dir") or ""),
        task=task,
        model=parse_model(data.get("model"), task),
        federation=typed("federation", FederationSpec, data.get("federation")),
        runtime=parse_runtime(data.get("runtime")),
        dataplane=parse_dataplane(data.get("dataplane")),
        head_on_server=scalar("", "head_on_server", data.get("head_on_server", True), bool),
        aggregated=scalar("", "aggregated", data.get("aggregated", True), bool),
        privacy=typed("privacy", PrivacySpec, data.get("privacy")),
        pipeline=typed("pipeline", PipelineSpec, data.get("pipeline")),
    )


_TOP_KEYS = frozenset(field.name for field in dataclasses.fields(RunConfig))


def check_finite(value: Any, key: str = "") -> None:
    """No number anywhere in the config is nan or +-inf: no setting of this project takes one (a rate, a
    speed, a core count or a concentration of inf is a typo or a test of the checks), and an infinite value
    reaching the system model or the testbed fails late and obscurely (``testbed.fastest_cores=inf`` made every
    CU's ``set_testbed`` fail in every round)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key {key or '<root>'}={value} must be a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{key}[{i}]")


def build_run_config(data: Mapping[str, Any]) -> RunConfig:
    """Validate a composed config mapping once and freeze it."""
    data = to_plain(data)
    check_finite(data)
    unknown = sorted(set(data) - _TOP_KEYS - {"hydra"})
    if unknown:
        raise ConfigError(f"unknown top-level config key {unknown[0]!r}; valid keys are {', '.join(sorted(_TOP_KEYS))}")
    for section in ("task", "model", "scheduler", "network"):
        require(
            isinstance(data.get(section), dict),
            f"config group {section} is missing; add {section}=<name> to the overrides",
        )
    seed = _seed(data)
    task = parse_task(data["task"])
    federation = typed("federation", FederationSpec, data.get("federation"))
    cfg = RunConfig(
        seed=seed,
        data_dir=str(data.get("data_dir") or ""),
        output_dir=str(data.get("output_dir") or "runs"),
        run_name=str(data.get("run_name") or ""),
        task=task,
        model=parse_model(data["model"], task),
        method=parse_method(data.get("method")),
        scheduler=parse_scheduler(data["scheduler"]),
        network=NetworkSpec.from_config(data["network"], federation.num_clusters),
        federation=federation,
        runtime=parse_runtime(data.get("runtime")),
        dataplane=parse_dataplane(data.get("dataplane")),
        eval=typed("eval", EvalSpec, data.get("eval")),
        save_client_weights=scalar("", "save_client_weights", data.get("save_client_weights", False), bool),
        checkpoint=scalar("", "checkpoint", data.get("checkpoint", True), bool),
        resume=scalar("", "resume", data.get("resume", False), bool),
        flower_log=choice("flower_log", str(data.get("flower_log", "warning")).lower(), FlowerLogLevel),
        tensorboard=scalar("", "tensorboard", data.get("tensorboard", False), bool),
        system=parse_system(data.get("system")),
        testbed=parse_testbed(data.get("testbed")),
        privacy=typed("privacy", PrivacySpec, data.get("privacy")),
        pipeline=typed("pipeline", PipelineSpec, data.get("pipeline")),
        clock=parse_clock(data.get("clock")),
        round_adapters=typed("round_adapters", RoundAdaptersSpec, data.get("round_adapters")),
    )
    _check_testbed(cfg)
    _check_clock(cfg)
    _check_privacy(cfg)
    _check_schedule(cfg)
    return cfg


def _seed(data: Mapping[str, Any]) -> int:
    """The ``seed`` key (default 0): an integer."""
    seed = data.get("seed", 0)
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed={seed!r} must be an integer")
    return seed


def _check_testbed(cfg: RunConfig) -> None:
    """The testbed's CPU quotas act on processes: each device needs its own (runtime.backend=ray); explicit
    cores are one per device of a cluster."""
    tb = cfg.testbed
    K = cfg.network.devices_per_cluster
    if tb.cpu_cores and len(tb.cpu_cores) != K:
        raise ConfigError(
            f"testbed.cpu_cores has {len(tb.cpu_cores)} entries for network.devices_per_cluster={K}; "
            "give one per device"
        )
    if tb.enabled and tb.cpu_quota and cfg.runtime.backend is not Backend.RAY:
        raise ConfigError(
            f"testbed.cpu_quota needs one process per device (runtime.backend=ray), not runtime.backend="
            f"{cfg.runtime.backend}; set runtime.backend=ray or testbed.cpu_quota=false (links throttled only)"
        )
    if (tb.enabled and tb.memory_limit or cfg.runtime.memory_cgroup) and cfg.runtime.backend is not Backend.RAY:
        raise ConfigError(
            "testbed.memory_limit and runtime.memory_cgroup need one process per device (runtime.backend=ray), not "
            f"runtime.backend={cfg.runtime.backend}; set runtime.backend=ray or testbed.memory_limit=false"
        )


def _check_clock(cfg: RunConfig) -> None:
    """The virtual clock is computed, never waited for: an emulated slowdown or throttle would only slow the run;
    and it counts the CPU of the thread that runs a call, which misses torch's other threads and a GPU's work: on
    an H200, a bert_small TEB's call read half its wall time in thread CPU seconds, and the same 2.2-2.6 ms for 1 to
    64 samples, where the work grows 64x (benchmarks/gpu_machine/thread_time_on_cuda.py, docs/testbed.md)."""
    if not cfg.clock.virtual:
        return
    if cfg.testbed.enabled or cfg.runtime.emulate:
        raise ConfigError(
            "clock=virtual computes the devices' and links' time instead of emulating it; drop testbed=emulated and "
            "runtime.emulate=true, or use clock=wall to time the emulation"
        )
    if cfg.runtime.torch_threads != 1:
        raise ConfigError(
            f"clock=virtual counts the CPU seconds of the thread that runs each call, which misses torch's other "
            f"threads; set runtime.torch_threads=1 (got {cfg.runtime.torch_threads})"
        )
    for key, device in (("runtime.device", cfg.runtime.device), ("runtime.server_device", cfg.runtime.head_device)):
        if device is not Device.CPU:
            raise ConfigError(
                f"clock=virtual scales each call's thread CPU seconds by the host's CPU FLOP rate, which does not "
                f"measure GPU work; set {key}=cpu (got {device.value}), or use clock=wall to time a GPU run"
            )


def _check_privacy(cfg: RunConfig) -> None:
    """Flower's DP mods clip the difference between what a CU downloaded and what it returns, part by part, so
    the CU must return every part it downloads: a frozen embedding is downloaded and not returned."""
    if cfg.privacy.enabled and cfg.federation.embedding is EmbeddingMode.FROZEN:
        raise ConfigError(
            f"privacy.mode={cfg.privacy.mode} clips each CU's whole update, which needs the embedding returned; "
            "set federation.embedding=trained or privacy.mode=none"
        )
    if cfg.privacy.enabled and cfg.model.adapters_only:
        raise ConfigError(
            f"privacy.mode={cfg.privacy.mode} clips each CU's whole update, but with model.lora.enabled a CU returns "
            "only its adapters; set model.lora.enabled=false or privacy.mode=none"
        )
    _check_privacy_budget(cfg)


def _check_privacy_budget(cfg: RunConfig) -> None:
    """privacy.max_epsilon > 0: the planned total epsilon (federation.num_rounds rounds, every cluster selected
    each round; config/privacy_accounting.py) must not exceed it."""
    privacy, rounds = cfg.privacy, cfg.federation.num_rounds
    if not privacy.enabled or privacy.max_epsilon <= 0:
        return
    planned = privacy.planned_epsilon(rounds)
    if planned <= privacy.max_epsilon:
        return
    knob = "raise privacy.noise_multiplier" if privacy.mode is PrivacyMode.CENTRAL else "lower privacy.epsilon"
    raise ConfigError(
        f"privacy.mode={privacy.mode} over federation.num_rounds={rounds} spends epsilon={planned:.4g} at "
        f"delta={privacy.delta:g} (every cluster selected each round) > privacy.max_epsilon={privacy.max_epsilon:g}; "
        f"{knob}, lower federation.num_rounds, or raise privacy.max_epsilon"
    )


def _check_schedule(cfg: RunConfig) -> None:
    """1F1B sends the decoder one exchange per micro-batch, each answered at once; the joint decoder update
    gathers whole steps of every cluster behind a barrier, and the ordered one queues whole steps in cluster
    order, so neither goes with 1F1B."""
    if cfg.pipeline.schedule is not Schedule.ONE_F_ONE_B:
        return
    refused = _ONE_PER_MICRO_BATCH_REFUSED.get(cfg.federation.decoder_update)
    if refused:
        raise ConfigError(
            "pipeline.schedule=1f1b exchanges each micro-batch with the decoder on its own, which "
            f"federation.decoder_update={cfg.federation.decoder_update} {refused}; set decoder_update=per_cu "
            "or schedule=gpipe"
        )


# the decoder updates that cannot take 1F1B's one exchange per micro-batch, and why
_ONE_PER_MICRO_BATCH_REFUSED = {
    DecoderUpdateMode.JOINT: "(one barrier per whole step) cannot gather",
    DecoderUpdateMode.ORDERED: "(whole steps in cluster order) cannot order",
}
