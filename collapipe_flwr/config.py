"""One configuration object, validated once at start-up.

Hydra's ``conf/`` is the source of truth. ``compose(overrides)`` builds the config from ``conf/config.yaml``
(used by the ServerApp, which receives the overrides as one run-config string, and by tests);
``python -m collapipe_flwr.experiments`` gets the same tree from ``@hydra.main``. Either way
:func:`build_run_config` turns the plain mapping into a frozen :class:`RunConfig`, raising a one-line
:class:`~collapipe_flwr.errors.ConfigError` that names the key and how to fix it.

Every section is parsed once, by the parser of the package that owns it (grep ``def parse_``):

=========== ==================================== ===========================================
section     spec                                 parser
=========== ==================================== ===========================================
task        ``tasks.spec.TaskSpec``              ``tasks.spec.parse_task``
model       ``tasks.spec.ModelSpec``             ``tasks.spec.parse_model``
method      ``dssra.specs.MethodSpec``           ``dssra.specs.parse_method``
scheduler   ``dssra.specs.SchedulerSpec``        ``dssra.specs.parse_scheduler``
network     ``system.network.NetworkSpec``       ``system.network.NetworkSpec.from_config``
runtime     ``pipeline.runtime_spec.RuntimeSpec`` ``pipeline.runtime_spec.parse_runtime``
federation  :class:`FederationSpec`              ``spec_parsing.typed`` (here)
dataplane   :class:`DataPlaneSpec`               ``spec_parsing.typed`` (here)
eval        :class:`EvalSpec`                    ``spec_parsing.typed`` (here)
system      ``system.measurement_spec.SystemSpec`` ``system.measurement_spec.parse_system``
testbed     ``system.measurement_spec.TestbedSpec`` ``system.measurement_spec.parse_testbed``
=========== ==================================== ===========================================

:func:`build_run_config` (the server, the sweep, ``train_central``, ``simulate``, benchmarks) and
:func:`build_cluster_config` (a CU, from the part the server sends) call those parsers. The ServerApp sends
a CU only :class:`ClusterConfig` (``RunConfig.cluster_config``): a CU on a real edge box needs no copy of
``conf/`` and never sees the scheduler, network, method or eval sections.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collapipe_flwr.dssra.specs import MethodSpec, SchedulerSpec, parse_method, parse_scheduler
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.runtime_spec import RuntimeSpec, parse_runtime
from collapipe_flwr.spec_parsing import check_keys, mapping, require, scalar, typed
from collapipe_flwr.system.measurement_spec import SystemSpec, TestbedSpec, parse_system, parse_testbed
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.tasks.spec import ModelSpec, TaskSpec, parse_model, parse_task

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
DATA_DIR_ENV = "COLLAPIPE_DATA_DIR"
DEFAULT_DATA_DIR_NAME = "data"  # ./data, made by `python -m collapipe_flwr.data prepare`

OPTIMIZER_STATES = ("keep", "reset")
SERVER_OPTIMIZERS = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
DECODER_UPDATES = ("per_cu", "joint")
FLOWER_LOG_LEVELS = ("debug", "info", "warning", "error")
EMBEDDING_MODES = ("trained", "frozen")


@dataclass(frozen=True)
class FederationSpec:
    """N clusters, T rounds, local steps per round (Algorithm 1)."""

    num_clusters: int = 2
    num_rounds: int = 3
    local_steps: int = 10
    round_timeout_s: float = 3600.0
    # Optimizer moments on the CU and its devices across rounds: keep (the CU's Adam state survives the
    # round's weight reload) | reset (fresh optimizer state every round, as a stateless CU would have).
    optimizer_state: str = "keep"
    # Server update of the aggregated parts (embedding, encoder): fedavg | fedavgm | fedadam | fedyogi |
    # fedadagrad (Flower's own strategy maths, see fl/server_optimizer.py).
    server_optimizer: str = "fedavg"
    server_lr: float = 1.0  # eta: server step size (fedavgm: server_learning_rate)
    server_momentum: float = 0.9  # fedavgm momentum; fedadam/fedyogi beta_1
    server_beta_2: float = 0.99  # fedadam / fedyogi / fedadagrad second moment
    server_tau: float = 1e-3  # fedadam / fedyogi / fedadagrad adaptivity
    # Algorithm 1 line 14: per_cu = one decoder update per CU step in arrival order | joint = one update
    # per step on the concatenated activations of all participating clusters (a barrier on the data plane).
    decoder_update: str = "per_cu"
    # The CU's embedding: trained (CUs train it and upload it with the encoder; FedAvg averages it) | frozen
    # (it keeps its initial values, so a CU uploads only z_enc and theta_enc, exactly eq. 11's terms).
    embedding: str = "trained"

    def __post_init__(self) -> None:
        require(
            self.embedding in EMBEDDING_MODES,
            f"federation.embedding={self.embedding!r} must be one of {', '.join(EMBEDDING_MODES)}",
        )
        require(self.num_clusters >= 1, f"federation.num_clusters={self.num_clusters} must be >= 1")
        require(
            self.optimizer_state in OPTIMIZER_STATES,
            f"federation.optimizer_state={self.optimizer_state!r} must be one of {', '.join(OPTIMIZER_STATES)}",
        )
        require(
            self.server_optimizer in SERVER_OPTIMIZERS,
            f"federation.server_optimizer={self.server_optimizer!r} must be one of {', '.join(SERVER_OPTIMIZERS)}",
        )
        require(self.server_lr > 0, f"federation.server_lr={self.server_lr} must be > 0")
        require(0 <= self.server_momentum < 1, f"federation.server_momentum={self.server_momentum} must be in [0, 1)")
        require(0 <= self.server_beta_2 < 1, f"federation.server_beta_2={self.server_beta_2} must be in [0, 1)")
        require(self.server_tau > 0, f"federation.server_tau={self.server_tau} must be > 0")
        require(
            self.decoder_update in DECODER_UPDATES,
            f"federation.decoder_update={self.decoder_update!r} must be one of {', '.join(DECODER_UPDATES)}",
        )
        require(self.num_rounds >= 1, f"federation.num_rounds={self.num_rounds} must be >= 1")
        require(self.local_steps >= 1, f"federation.local_steps={self.local_steps} must be >= 1")
        require(self.round_timeout_s > 0, "federation.round_timeout_s must be > 0")


@dataclass(frozen=True)
class DataPlaneSpec:
    """The per-step channel between CUs and the server's decoder."""

    host: str = "127.0.0.1"
    bind: str = ""  # "" = the announced host only; "0.0.0.0" listens on every interface
    port: int = 0
    fp16: bool = False  # the older switch: true = compression fp16
    # what z_enc and dL/dz_enc travel as: none (float32) | fp16 (scaled float16) | int8 (per-channel scales)
    compression: str = "none"
    # largest step frame either end accepts; 0 = sized from the task (fl/dataplane/transport.step_message_mb:
    # b x max_len tokens of z_enc and labels, with room to spare), so a flood cannot park big frames in memory
    max_message_mb: int = 0
    timeout_s: float = 120.0
    # an authenticated stream that sends no step for this long is cancelled (its CU reopens one on its next
    # step), so streams left open by a stuck or hostile CU do not hold the server's workers
    idle_timeout_s: float = 30.0
    # the decoder refuses a step whose |z_enc| exceeds this (finite but huge activations would turn its loss
    # NaN); 0 = no limit. Encoder outputs after LayerNorm are O(10).
    max_abs_activation: float = 1e4
    # TLS for the data plane (PEM files on the server, e.g. the ones given to the SuperLink's --ssl-* flags):
    # the CUs get the CA (or the certificate) in their train message. "" = plaintext (loopback, tests).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # same-host shortcut (fl/dataplane/shm.py): auto = a CU that reaches the host on a loopback address passes
    # its frames through shared memory and only a pointer over gRPC (plaintext channels) | off = always inline
    shared_memory: str = "auto"

    def __post_init__(self) -> None:
        require(bool(self.tls_cert) == bool(self.tls_key), "dataplane.tls_cert and dataplane.tls_key go together")
        require(
            self.shared_memory in ("auto", "off"),
            f"dataplane.shared_memory={self.shared_memory!r} must be auto or off",
        )
        require(0 <= self.port < 65536, f"dataplane.port={self.port} must be in 0..65535 (0 = any free port)")
        require(self.max_abs_activation >= 0, "dataplane.max_abs_activation must be >= 0 (0 = no limit)")
        require(self.max_message_mb >= 0, "dataplane.max_message_mb must be >= 0 (0 = sized from the task)")
        require(self.idle_timeout_s > 0, "dataplane.idle_timeout_s must be > 0")
        require(self.timeout_s > 0, "dataplane.timeout_s must be > 0")
        require(
            self.compression in ("none", "fp16", "int8"),
            f"dataplane.compression={self.compression!r} must be none, fp16 or int8",
        )
        require(
            not self.fp16 or self.compression in ("none", "fp16"),
            f"dataplane.fp16=true contradicts dataplane.compression={self.compression}; drop fp16 (use compression)",
        )

    @property
    def wire(self) -> str:
        """The effective wire compression: ``compression``, or fp16 when the older ``fp16`` switch is on."""
        return "fp16" if self.fp16 else self.compression


@dataclass(frozen=True)
class EvalSpec:
    max_examples: int = 0
    batch_size: int = 64
    beam_size: int = 1
    every: int = 1  # evaluate after rounds every, 2*every, ... and always after the last round
    at_start: bool = True  # also evaluate the initial model (round 0)

    def __post_init__(self) -> None:
        require(self.every >= 1, "eval.every must be >= 1 (1 = evaluate after every round)")
        require(self.max_examples >= 0, "eval.max_examples must be >= 0 (0 = whole validation split)")
        require(self.batch_size >= 1, "eval.batch_size must be >= 1")
        require(self.beam_size >= 1, "eval.beam_size must be >= 1")


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
    checkpoint: bool = True  # save the server's state after every round (fl/checkpoint.py)
    resume: bool = False  # continue the run in output_dir/run_name from its last checkpoint
    flower_log: str = "warning"  # Flower's own ServerApp log lines: "info" shows its round banners and dump
    tensorboard: bool = False  # also log each round's scalars to <run folder>/tensorboard (needs tensorboard)
    system: SystemSpec = SystemSpec()  # where DSSRA's device and link numbers come from (config | measured)
    testbed: TestbedSpec = TestbedSpec()  # the emulated heterogeneous testbed (off unless testbed=emulated)

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
            "eval": dataclasses.asdict(self.eval),
            "save_client_weights": self.save_client_weights,
            "checkpoint": self.checkpoint,
            "flower_log": self.flower_log,
            "tensorboard": self.tensorboard,
            "resume": self.resume,
            "system": self.system.to_raw(),
            "testbed": self.testbed.to_raw(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        return build_run_config(data)

    def cluster_config(self) -> ClusterConfig:
        """The part of this config a CU uses: what the server sends in its hello and train messages."""
        return ClusterConfig(
            seed=self.seed,
            data_dir=self.data_dir,
            task=self.task,
            model=self.model,
            federation=self.federation,
            runtime=self.runtime,
            dataplane=self.dataplane,
            head_on_server=self.method.head_on_server,
        )


@dataclass(frozen=True)
class ClusterConfig:
    """What a CU needs of the run config (a CU never sees the scheduler, network, method or eval sections):
    the task and model, the federation's round / step counts, the runtime of its devices, the data plane's
    wire settings, and whether the head is the server's (data plane) or its own (``method.head_on_server``)."""

    seed: int
    data_dir: str
    task: TaskSpec
    model: ModelSpec
    federation: FederationSpec
    runtime: RuntimeSpec
    dataplane: DataPlaneSpec
    head_on_server: bool

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
        }

    def with_data_dir(self, data_dir: str) -> ClusterConfig:
        """This config reading its data from ``data_dir`` (the CU's own copy) when one is given."""
        return dataclasses.replace(self, data_dir=str(data_dir)) if data_dir else self


AnyConfig = RunConfig | ClusterConfig  # what the functions both sides use (task, model, runtime ...) accept


def build_cluster_config(data: Mapping[str, Any]) -> ClusterConfig:
    """The CU's side of :func:`build_run_config`: the same section parsers over the part the server sent."""
    data = mapping("cluster config", data)
    check_keys("cluster config", data, {f.name for f in dataclasses.fields(ClusterConfig)})
    seed = data.get("seed", 0)
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed={seed!r} must be an integer")
    task = parse_task(data.get("task"))
    return ClusterConfig(
        seed=seed,
        data_dir=str(data.get("data_dir") or ""),
        task=task,
        model=parse_model(data.get("model"), task),
        federation=typed("federation", FederationSpec, data.get("federation")),
        runtime=parse_runtime(data.get("runtime")),
        dataplane=typed("dataplane", DataPlaneSpec, data.get("dataplane")),
        head_on_server=scalar("", "head_on_server", data.get("head_on_server", True), bool),
    )


def default_data_dirs(cwd: Path | None = None) -> list[Path]:
    """Where the datasets are looked for when neither data_dir nor $COLLAPIPE_DATA_DIR is set:
    ``./data`` (the repository root's ``data/`` when commands start there, where
    ``python -m collapipe_flwr.data prepare`` writes by default), then ``data/`` beside ``conf/``."""
    here = (cwd or Path.cwd()) / DEFAULT_DATA_DIR_NAME
    beside_conf = CONF_DIR.parent / DEFAULT_DATA_DIR_NAME
    return [here] if here.resolve() == beside_conf.resolve() else [here, beside_conf]


def resolve_data_dir(explicit: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> Path:
    """The dataset folder: an explicit value, else the COLLAPIPE_DATA_DIR variable of ``environ``
    (default: this process's environment), else the first of :func:`default_data_dirs` that exists."""
    environ = os.environ if environ is None else environ
    value = str(explicit or "") or environ.get(DATA_DIR_ENV, "")
    if not value:
        for candidate in default_data_dirs():
            if candidate.is_dir():
                return candidate.resolve()
        raise ConfigError(
            f"no data directory: run `python -m collapipe_flwr.data prepare` (writes ./{DEFAULT_DATA_DIR_NAME}), "
            f"or set data_dir (run config data-dir) or {DATA_DIR_ENV} to the folder holding multi30k/, "
            "chinese_ner/, toutiao/ (docs/data.md)"
        )
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(
            f"data directory {path} does not exist; point data_dir or {DATA_DIR_ENV} at the dataset folder "
            "or run `python -m collapipe_flwr.data prepare` (docs/data.md)"
        )
    return path


_TOP_KEYS = {
    "seed",
    "data_dir",
    "output_dir",
    "run_name",
    "task",
    "model",
    "method",
    "scheduler",
    "network",
    "federation",
    "runtime",
    "dataplane",
    "eval",
    "save_client_weights",
    "checkpoint",
    "flower_log",
    "tensorboard",
    "resume",
    "system",
    "testbed",
}


def build_run_config(data: Mapping[str, Any]) -> RunConfig:
    """Validate a composed config mapping once and freeze it."""
    data = _to_plain(data)
    unknown = sorted(set(data) - _TOP_KEYS - {"hydra"})
    if unknown:
        raise ConfigError(f"unknown top-level config key {unknown[0]!r}; valid keys are {', '.join(sorted(_TOP_KEYS))}")
    for section in ("task", "model", "scheduler", "network"):
        require(
            isinstance(data.get(section), dict),
            f"config group {section} is missing; add {section}=<name> to the overrides",
        )
    seed = data.get("seed", 0)
    require(isinstance(seed, int) and not isinstance(seed, bool), f"seed={seed!r} must be an integer")
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
        dataplane=typed("dataplane", DataPlaneSpec, data.get("dataplane")),
        eval=typed("eval", EvalSpec, data.get("eval")),
        save_client_weights=scalar("", "save_client_weights", data.get("save_client_weights", False), bool),
        checkpoint=scalar("", "checkpoint", data.get("checkpoint", True), bool),
        resume=scalar("", "resume", data.get("resume", False), bool),
        flower_log=_choice("flower_log", data.get("flower_log", "warning"), FLOWER_LOG_LEVELS),
        tensorboard=scalar("", "tensorboard", data.get("tensorboard", False), bool),
        system=parse_system(data.get("system")),
        testbed=parse_testbed(data.get("testbed")),
    )
    _check_testbed(cfg)
    return cfg


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
    if tb.enabled and tb.cpu_quota and cfg.runtime.backend != "ray":
        raise ConfigError(
            f"testbed.cpu_quota needs one process per device (runtime.backend=ray), not runtime.backend="
            f"{cfg.runtime.backend}; set runtime.backend=ray or testbed.cpu_quota=false (links throttled only)"
        )


def _choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    text = str(value).lower()
    if text not in choices:
        raise ConfigError(f"{key}={value!r} must be one of {', '.join(choices)}")
    return text


def _to_plain(data: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(data, (DictConfig, ListConfig)):
            return OmegaConf.to_container(data, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if isinstance(data, Mapping):
        return {str(k): _to_plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_to_plain(v) for v in data]
    return data


def split_overrides(text: str) -> list[str]:
    """Split the ``overrides`` run-config string (``"task=ner federation.num_rounds=2"``) shell-style."""
    try:
        return shlex.split(text or "")
    except ValueError as err:
        raise ConfigError(f"cannot parse overrides {text!r}: {err}; quote values with spaces") from None


def names_group(overrides: list[str], group: str) -> bool:
    """Whether the overrides choose config group ``group`` (``model=...``, ``+model=...``)."""
    return any(o.split("=", 1)[0].lstrip("+~") == group for o in overrides)


def with_task_default_model(overrides: list[str], composed: Mapping[str, Any]) -> list[str] | None:
    """The overrides plus ``model=<task.default_model>`` when the user chose a task but no model and the
    composed model is not the task's own (Hydra composes ``task`` before ``model``, so a task file
    cannot pick the model itself); None when nothing needs to change."""
    default_model = (composed.get("task") or {}).get("default_model")
    if not default_model or names_group(overrides, "model"):
        return None
    if (composed.get("model") or {}).get("name") == default_model:
        return None
    return [*overrides, f"model={default_model}"]


_RENAMED = {"model.schedule": "model.lr_schedule"}


def _refuse_renamed_keys(overrides: Sequence[str]) -> None:
    """An override of a renamed key says its new name (Hydra alone would only say it cannot override it)."""
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        for old, new in _RENAMED.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(f"{old} was renamed to {new}; write {new + key[len(old) :]}=... instead of {item!r}")


def compose(overrides: Sequence[str] | str = (), config_dir: Path | None = None) -> dict:
    """Compose ``conf/config.yaml`` with Hydra overrides, return a plain resolved mapping. Without a
    ``model=`` override the model is the task's ``default_model``."""
    if isinstance(overrides, str):
        overrides = split_overrides(overrides)
    _refuse_renamed_keys(overrides)
    composed = _compose_once(list(overrides), config_dir)
    again = with_task_default_model(list(overrides), composed)
    return composed if again is None else _compose_once(again, config_dir)


def _compose_once(overrides: list[str], config_dir: Path | None = None) -> dict:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    conf = Path(config_dir or CONF_DIR).resolve()
    if not (conf / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {conf}; run from the project root or pass the conf/ folder")
    try:
        if GlobalHydra.instance().is_initialized():  # inside @hydra.main (the sweep entry point): reuse it
            composed = hydra_compose(config_name="config", overrides=list(overrides))
        else:
            with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="collapipe"):
                composed = hydra_compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"bad config override: {first}") from None
    return _to_plain(composed)


def load_run_config(overrides: Sequence[str] | str = (), **top_level: Any) -> RunConfig:
    """Compose + validate. ``top_level`` (e.g. ``data_dir=...``) wins over the composed values."""
    data = compose(overrides)
    for key, value in top_level.items():
        if value not in (None, ""):
            data[key] = value
    return build_run_config(data)
