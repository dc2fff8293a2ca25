"""The run-level sections this package parses itself (with ``spec_parsing.typed``): ``federation``,
``pipeline``, ``dataplane`` and ``eval``; each checks its values once, on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.config.server_optimizer_rules import ServerOptimizerName, check_server_optimizer
from collapipe_flwr.precision import Precision
from collapipe_flwr.spec_parsing import choices, mapping, require, typed
from collapipe_flwr.system.pipeline_model import Checkpoint, Schedule


class OptimizerState(StrEnum):
    """``federation.optimizer_state``: the CU's optimizer moments across rounds."""

    KEEP = "keep"
    RESET = "reset"


class DecoderUpdateMode(StrEnum):
    """``federation.decoder_update``: how the CUs' steps reach the server's decoder (Algorithm 1, line 14; the
    protocol of each is fl/server/decoder/update_modes.py)."""

    PER_CU = "per_cu"
    JOINT = "joint"
    ORDERED = "ordered"

    @property
    def cus_wait(self) -> bool:
        """Whether a CU's step waits for other CUs' steps (joint: the barrier; ordered: the turnstile)."""
        return self is not DecoderUpdateMode.PER_CU


class EmbeddingMode(StrEnum):
    """``federation.embedding``: whether the CUs train the embedding and upload it (eq. 11)."""

    TRAINED = "trained"
    FROZEN = "frozen"


class Compression(StrEnum):
    """``dataplane.compression``: what z_enc and dL/dz_enc travel as (fl/dataplane/protocol.py)."""

    NONE = "none"  # float32
    FP16 = "fp16"  # scaled float16
    INT8 = "int8"  # int8 with per-channel scales


class SharedMemory(StrEnum):
    """``dataplane.shared_memory``: the same-host shortcut through a shared-memory segment (fl/dataplane/shm.py)."""

    AUTO = "auto"
    OFF = "off"


class Transport(StrEnum):
    """``dataplane.transport``: what carries the CUs' streams (fl/dataplane/backend.py)."""

    GRPC = "grpc"
    SOCKET = "socket"


# the refusal of the dataplane section's old fp16 switch (in a config mapping or as an override: config.hydra_conf)
FP16_REMOVED = (
    "dataplane.fp16 was removed; use dataplane.compression: fp16 instead (override: dataplane.compression=fp16)"
)


@dataclass(frozen=True)
class FederationSpec:
    """N clusters, T rounds, local steps per round (Algorithm 1)."""

    num_clusters: int = 2
    num_rounds: int = 3
    local_steps: int = 10
    round_timeout_s: float = 3600.0
    # K: the run stops with an error after K consecutive rounds in which no CU completed a round (0: never
    # early; a run in which no round trained fails at its end either way: fl/server/training_watch.py)
    max_failed_rounds: int = 3
    # Optimizer moments on the CU and its devices across rounds: keep (the CU's Adam state survives the
    # round's weight reload) | reset (fresh optimizer state every round, as a stateless CU would have).
    optimizer_state: OptimizerState = OptimizerState.KEEP
    # Server update of the aggregated parts (embedding, encoder): fedavg | fedavgm | fedadam | fedyogi |
    # fedadagrad (Flower's own strategy maths, see fl/server/aggregation/server_optimizer.py); the choices and
    # the ranges below are config/server_optimizer_rules.py's.
    server_optimizer: ServerOptimizerName = ServerOptimizerName.FEDAVG
    server_lr: float = 1.0  # eta: server step size (fedavgm: server_learning_rate), > 0
    server_momentum: float = 0.9  # fedavgm momentum; fedadam/fedyogi beta_1, in [0, 1)
    server_beta_2: float = 0.99  # fedadam / fedyogi second moment, in [0, 1)
    server_tau: float = 1e-3  # fedadam / fedyogi / fedadagrad adaptivity, > 0
    # Algorithm 1 line 14: per_cu = one decoder update per CU step in arrival order | joint = one update
    # per step on the concatenated activations of all participating clusters (a barrier on the data plane) |
    # ordered = per_cu in cluster order: step seq of cluster 0, 1, ..., then step seq + 1 (a turnstile), so
    # runs with the same seed give the same decoder.
    decoder_update: DecoderUpdateMode = DecoderUpdateMode.PER_CU
    # The CU's embedding: trained (CUs train it and upload it with the encoder; FedAvg averages it) | frozen
    # (it keeps its initial values, so a CU uploads only z_enc and theta_enc, exactly eq. 11's terms).
    embedding: EmbeddingMode = EmbeddingMode.TRAINED

    def __post_init__(self) -> None:
        choices(
            self,
            "federation",
            embedding=EmbeddingMode,
            optimizer_state=OptimizerState,
            decoder_update=DecoderUpdateMode,
        )
        require(self.num_clusters >= 1, f"federation.num_clusters={self.num_clusters} must be >= 1")
        server_optimizer = check_server_optimizer(
            self.server_optimizer,
            {
                "lr": self.server_lr,
                "momentum": self.server_momentum,
                "beta_2": self.server_beta_2,
                "tau": self.server_tau,
            },
            name_key="federation.server_optimizer",
            key_of=lambda name: f"federation.server_{name}",
            used_only=False,  # every value in the config must be valid, whichever optimizer it names
        )
        object.__setattr__(self, "server_optimizer", server_optimizer)
        require(self.num_rounds >= 1, f"federation.num_rounds={self.num_rounds} must be >= 1")
        require(self.local_steps >= 1, f"federation.local_steps={self.local_steps} must be >= 1")
        require(self.round_timeout_s > 0, "federation.round_timeout_s must be > 0")
        require(self.max_failed_rounds >= 0, f"federation.max_failed_rounds={self.max_failed_rounds} must be >= 0")


@dataclass(frozen=True)
class PipelineSpec:
    """How a cluster's S stages run its m micro-batches. schedule: ``gpipe`` (every forward, one head call on
    the whole batch, every backward: a stage holds all m micro-batches' activations) | ``1f1b`` (one head
    exchange per micro-batch, stage k runs min(S - k - 1, m) warm-up forwards then one forward / one backward,
    so it holds at most min(m, S - k); the same gradients and parameters after a step). checkpoint: GPipe's
    re-materialization (``system.pipeline_model.Checkpoint``): ``never`` (every held micro-batch's activations kept
    for its backward) | ``except_last`` | ``always`` (a stage keeps only a checkpointed micro-batch's segment input
    and recomputes its forward in the backward: about one extra forward per micro-batch for the activation memory
    of one micro-batch instead of all held ones; the same gradients)."""

    schedule: Schedule = Schedule.GPIPE
    checkpoint: Checkpoint = Checkpoint.NEVER

    def __post_init__(self) -> None:
        choices(self, "pipeline", schedule=Schedule, checkpoint=Checkpoint)

    def to_raw(self) -> dict[str, Any]:
        """The YAML-shaped section; ``checkpoint`` only when changed, so the config.json of earlier runs stays the
        same (a resume compares them)."""
        raw = {"schedule": self.schedule.value, "checkpoint": self.checkpoint.value}
        if self.checkpoint is Checkpoint.NEVER:
            del raw["checkpoint"]
        return raw


@dataclass(frozen=True)
class DataPlaneSpec:
    """The per-step channel between CUs and the server's decoder."""

    host: str = "127.0.0.1"
    bind: str = ""  # "" = the announced host only; "0.0.0.0" listens on every interface
    port: int = 0
    # what z_enc and dL/dz_enc travel as: none (float32) | fp16 (scaled float16) | int8 (per-channel scales)
    compression: Compression = Compression.NONE
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
    shared_memory: SharedMemory = SharedMemory.AUTO
    # what carries the CUs' streams (fl/dataplane/backend.py): socket = one plain TCP connection per CU (TLS by
    # ssl), the lowest latency | grpc = one gRPC bidirectional stream per CU (passes HTTP/2 proxies and balancers)
    transport: Transport = Transport.SOCKET

    def __post_init__(self) -> None:
        require(bool(self.tls_cert) == bool(self.tls_key), "dataplane.tls_cert and dataplane.tls_key go together")
        choices(self, "dataplane", transport=Transport, shared_memory=SharedMemory, compression=Compression)
        require(0 <= self.port < 65536, f"dataplane.port={self.port} must be in 0..65535 (0 = any free port)")
        require(self.max_abs_activation >= 0, "dataplane.max_abs_activation must be >= 0 (0 = no limit)")
        require(self.max_message_mb >= 0, "dataplane.max_message_mb must be >= 0 (0 = sized from the task)")
        require(self.idle_timeout_s > 0, "dataplane.idle_timeout_s must be > 0")
        require(self.timeout_s > 0, "dataplane.timeout_s must be > 0")


def parse_dataplane(raw: Any) -> DataPlaneSpec:
    """The ``dataplane`` section: the old ``fp16`` switch refused with what replaces it, the rest typed."""
    raw = mapping("dataplane", raw)
    require("fp16" not in raw, FP16_REMOVED)
    return typed("dataplane", DataPlaneSpec, raw)


class EvalPrecision(StrEnum):
    """``eval.precision``: the compute precision of the evaluation's forward passes: ``runtime`` (default) follows
    ``runtime.precision``; ``auto`` | ``fp32`` | ``bf16`` set it for the evaluation alone (precision.py), e.g. fp32
    scoring of a model trained under bf16 autocast (bf16 moved a pretrained LLM's perplexity by 3.5%, issue 66)."""

    RUNTIME = "runtime"
    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"


@dataclass(frozen=True)
class EvalSpec:
    max_examples: int = 0
    batch_size: int = 64
    beam_size: int = 1
    every: int = 1  # evaluate after rounds every, 2*every, ... and always after the last round
    at_start: bool = True  # also evaluate the initial model (round 0)
    precision: EvalPrecision = EvalPrecision.RUNTIME  # runtime = runtime.precision's

    def __post_init__(self) -> None:
        choices(self, "eval", precision=EvalPrecision)
        require(self.every >= 1, "eval.every must be >= 1 (1 = evaluate after every round)")
        require(self.max_examples >= 0, "eval.max_examples must be >= 0 (0 = whole validation split)")
        require(self.batch_size >= 1, "eval.batch_size must be >= 1")
        require(self.beam_size >= 1, "eval.beam_size must be >= 1")

    def resolved_precision(self, runtime_precision: str) -> Precision:
        """The evaluation's precision before :func:`collapipe_flwr.precision.resolve_precision`: its own, or
        ``runtime_precision`` under ``runtime``."""
        if self.precision is EvalPrecision.RUNTIME:
            return Precision(str(runtime_precision))
        return Precision(self.precision.value)

    def to_raw(self) -> dict[str, Any]:
        """The YAML-shaped section; ``precision`` only when changed, so the config.json of earlier runs stays the
        same (a resume compares them)."""
        raw = {**dataclasses.asdict(self), "precision": self.precision.value}
        if self.precision is EvalPrecision.RUNTIME:
            del raw["precision"]
        return raw
