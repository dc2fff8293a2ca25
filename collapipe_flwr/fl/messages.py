"""What travels in Flower messages (control and weights, once per round; never per step): the message
types, every record key, and the pack / read helpers. Nothing else in the package spells these strings.

train (server -> CU):   RecordDict{WEIGHTS: ArrayRecord, INSTRUCTIONS: ConfigRecord{"json": str}}
train reply (CU -> server): RecordDict{WEIGHTS: ArrayRecord, METRICS: MetricRecord}
query.hello (server -> CU): RecordDict{CLUSTER_CONFIG: ConfigRecord{"json": str}} (the CU's part of the run's
    config, ``config.ClusterConfig``); reply RecordDict{HELLO_REPLY: MetricRecord{PARTITION_ID, NUM_PARTITIONS,
    NUM_EXAMPLES, LABEL_HISTOGRAM}}
query.release (server -> CU, after the last round): RecordDict{RELEASE_INFO: ConfigRecord{RELEASE_NUM_DEVICES,
    RELEASE_CU_STATE_KEY}} (:class:`ReleaseInstructions`); reply RecordDict{RELEASE_REPLY:
    MetricRecord{DEVICE_ACTORS_RELEASED}}

"Run config" alone means Flower's flat run config (``config/flower_keys.py``); the validated whole is
``config.RunConfig``, and what a CU gets of it, ``config.ClusterConfig``.

Weights are one flat state dict whose names start with ``embedding.``, ``encoder.`` (the concatenated
segments, eq. 4) and, for methods that train the head on the CU, ``head.``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from collapipe_flwr.config import ClusterConfig, PrivacyMode, build_cluster_config
from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.dssra.replan import Sub1Inputs
from collapipe_flwr.errors import CannotContinue, CollaPipeError, ConfigError
from collapipe_flwr.flower_internals import KEY_CLIPPING_NORM
from collapipe_flwr.models.split import PARTS
from collapipe_flwr.pipeline.virtual_clock import ClusterClock
from collapipe_flwr.system.devices import DeviceProfile
from collapipe_flwr.system.profile import (
    ClusterProfile,
    DeviceEmulation,
    DeviceMeasurement,
    LinkMeasurement,
    ProfileError,
)

# ----------------------------------------------------------------------------- message types
TRAIN = MessageType.TRAIN
HELLO_ACTION = "hello"  # client_app: @app.query(HELLO_ACTION)
RELEASE_ACTION = "release"  # client_app: @app.query(RELEASE_ACTION)
HELLO = f"{MessageType.QUERY}.{HELLO_ACTION}"
RELEASE = f"{MessageType.QUERY}.{RELEASE_ACTION}"
# Error codes of a CU's error reply: a user error (config, data, device) that fails this CU's round, and one
# every later round would repeat until the user acts (errors.CannotContinue: the server stops the run with it)
USER_ERROR_CODE = 4200
CANNOT_CONTINUE_CODE = 4201

# ----------------------------------------------------------------------------- record keys
WEIGHTS = "weights"
INSTRUCTIONS = "instructions"
METRICS = "metrics"
CLUSTER_CONFIG = "cluster-config"
RELEASE_INFO = "release-info"
HELLO_REPLY = "hello"
RELEASE_REPLY = "release"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
LABEL_HISTOGRAM = "label-histogram"  # hello reply: examples of the CU's partition per label (Task.partition_labels)
RELEASE_NUM_DEVICES = "release-num-devices"
RELEASE_CU_STATE_KEY = "release-cu-state-key"  # the run's key of the CUs' own checkpoints, removed at release
DEVICE_ACTORS_RELEASED = "device-actors-released"
# a CU's measured profile in its train reply (system/profile.py), one list entry per device k (NaN = not measured)
PROFILE_SECONDS_PER_SAMPLE_BLOCK = "profile-seconds-per-sample-block"
PROFILE_MICROBATCH_S = "profile-microbatch-s"
PROFILE_MEMORY_BYTES = "profile-memory-bytes"
PROFILE_LINK_BYTES_PER_S = "profile-link-bytes-per-s"
PROFILE_LINK_LATENCY_S = "profile-link-latency-s"
PROFILE_CU_STEP_S = "profile-cu-step-s"
PROFILE_KEYS = (
    PROFILE_SECONDS_PER_SAMPLE_BLOCK,
    PROFILE_MICROBATCH_S,
    PROFILE_MEMORY_BYTES,
    PROFILE_LINK_BYTES_PER_S,
    PROFILE_LINK_LATENCY_S,
)


def pack_weights(parts: dict[str, dict[str, torch.Tensor]]) -> ArrayRecord:
    """{"embedding": sd, "encoder": sd, ...} -> one ArrayRecord with prefixed names, the parts always in the order
    of ``PARTS`` (a CU's reply lists its arrays in the order of what it downloaded, as Flower's DP mods require)."""
    flat = {}
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise ValueError(f"unknown weight part {unknown[0]!r}")
    for part in sorted(parts, key=PARTS.index):
        for name, tensor in parts[part].items():
            tensor = tensor.detach().cpu()
            if tensor.dtype == torch.bfloat16:  # Flower's arrays are numpy's, which has no bfloat16: exact in fp32
                tensor = tensor.float()  # (a bf16 frozen base, model.base_dtype; loading it back rounds exactly)
            flat[f"{part}.{name}"] = tensor.contiguous()
    return ArrayRecord(torch_state_dict=flat)


def unpack_weights(record: ArrayRecord) -> dict[str, dict[str, torch.Tensor]]:
    """Inverse of :func:`pack_weights`."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in record.to_torch_state_dict().items():
        part, _, rest = name.partition(".")
        if part not in PARTS or not rest:
            raise CollaPipeError(
                f"weight {name!r} in a message does not start with one of {PARTS}; the CU and server versions differ"
            )
        parts.setdefault(part, {})[rest] = tensor
    return parts


@dataclass(frozen=True)
class TrainInstructions:
    """Everything a CU needs for one round; JSON-safe so it fits one ConfigRecord string."""

    round: int
    plan: ClusterPlan
    cluster_config: ClusterConfig  # the part of the run config a CU uses (its data folder set by the CU)
    devices: list[DeviceProfile]  # the cluster's K devices as the planner models them
    dataplane_address: str = ""
    dataplane_secret: str = ""  # this CU's own data-plane key for this round (fl/dataplane/auth.py)
    dataplane_root_certificate: str = ""  # PEM the CU trusts for the data plane's TLS ("" = plaintext)
    replan: Sub1Inputs | None = None  # Sub-1's inputs for this cluster (dssra/replan.py), for a device lost mid-round
    measure: int = 0  # measure the devices and links this round with this many timed calls per size (0 = not)
    emulation: DeviceEmulation | None = None  # the testbed's quotas and link rates (testbed=emulated)
    report_profile: bool = False  # reply with the profile metrics (system.profile: measured, or the testbed on)
    cu_state_key: str = ""  # save the CU's optimizer moments under this run key each round (fl/cu/cu_checkpoint.py)
    clock: ClusterClock | None = (
        None  # the virtual clock's rates for this cluster and round (pipeline/virtual_clock.py)
    )

    def to_record(self) -> ConfigRecord:
        payload = {
            "round": self.round,
            "plan": self.plan.to_dict(),
            "cluster_config": self.cluster_config.to_dict(),
            "devices": [d.to_dict() for d in self.devices],
            "dataplane_address": self.dataplane_address,
            "dataplane_secret": self.dataplane_secret,
            "dataplane_root_certificate": self.dataplane_root_certificate,
            "replan": self.replan.to_dict() if self.replan is not None else None,
            "measure": self.measure,
            "emulation": self.emulation.to_dict() if self.emulation is not None else None,
            "report_profile": self.report_profile,
            "cu_state_key": self.cu_state_key,
            "clock": self.clock.to_dict() if self.clock is not None else None,
        }
        record = ConfigRecord({"json": json.dumps(payload)})
        privacy = self.cluster_config.privacy
        if privacy.mode is PrivacyMode.CENTRAL:  # Flower's fixedclipping_mod reads C from the train message's record
            record[KEY_CLIPPING_NORM] = float(privacy.clipping_norm)
        return record

    @classmethod
    def from_record(cls, record: ConfigRecord) -> TrainInstructions:
        """The instructions decoded once, into the typed objects the CU uses as they are."""
        try:
            payload = json.loads(str(record["json"]))
            replan, emulation, clock = payload.get("replan"), payload.get("emulation"), payload.get("clock")
            return cls(
                round=int(payload["round"]),
                plan=ClusterPlan.from_dict(payload["plan"]),
                cluster_config=build_cluster_config(payload["cluster_config"]),
                devices=[DeviceProfile.from_dict(d) for d in payload["devices"]],
                dataplane_address=str(payload.get("dataplane_address", "")),
                dataplane_secret=str(payload.get("dataplane_secret", "")),
                dataplane_root_certificate=str(payload.get("dataplane_root_certificate", "")),
                replan=Sub1Inputs.from_dict(replan) if replan is not None else None,
                measure=int(payload.get("measure", 0)),
                emulation=DeviceEmulation.from_dict(emulation) if emulation is not None else None,
                report_profile=bool(payload.get("report_profile", False)),
                cu_state_key=str(payload.get("cu_state_key", "")),
                clock=ClusterClock.from_dict(clock) if clock is not None else None,
            )
        except ConfigError:
            raise  # the cluster config names its own bad key
        except (KeyError, TypeError, ValueError) as err:
            raise CollaPipeError(
                f"malformed train instructions ({err}); the server and CU run different versions"
            ) from None


def train_content(weights: ArrayRecord, instructions: TrainInstructions) -> RecordDict:
    return RecordDict({WEIGHTS: weights, INSTRUCTIONS: instructions.to_record()})


def read_train(msg: Message) -> tuple[ArrayRecord, TrainInstructions]:
    content = msg.content
    if WEIGHTS not in content.array_records or INSTRUCTIONS not in content.config_records:
        raise CollaPipeError("train message lacks weights or instructions; the server and CU run different versions")
    return content.array_records[WEIGHTS], TrainInstructions.from_record(content.config_records[INSTRUCTIONS])


def reply_content(weights: ArrayRecord, metrics: dict) -> RecordDict:
    return RecordDict({WEIGHTS: weights, METRICS: MetricRecord(metrics)})


def read_reply(msg: Message) -> tuple[ArrayRecord, dict]:
    if msg.has_error():
        kind = CannotContinue if msg.error.code == CANNOT_CONTINUE_CODE else CollaPipeError
        raise kind(f"CU on node {msg.metadata.src_node_id} failed: {msg.error.reason}")
    content = msg.content
    if WEIGHTS not in content.array_records or METRICS not in content.metric_records:
        raise CollaPipeError(f"reply from node {msg.metadata.src_node_id} lacks weights or metrics")
    return content.array_records[WEIGHTS], dict(content.metric_records[METRICS])


def metric_int(record: MetricRecord, key: str, sender: int) -> int:
    """``record[key]`` of a reply from node ``sender`` as an int (a scalar metric, not a list)."""
    value = record[key]
    if not isinstance(value, (int, float)):
        raise CollaPipeError(f"reply from node {sender} has {key}={value!r}; expected a number")
    return int(value)


def metric_counts(record: MetricRecord, key: str, sender: int) -> list[int]:
    """``record[key]`` of a reply from node ``sender`` as a list of counts (absent: [])."""
    if key not in record:
        return []
    value = record[key]
    if not isinstance(value, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 and float(x).is_integer() for x in value
    ):
        raise CollaPipeError(f"reply from node {sender} has {key}={value!r}; expected a list of counts")
    return [int(x) for x in value]


def profile_metrics(profile: ClusterProfile) -> dict:
    """A measured profile as reply metrics (MetricRecord holds numbers and lists of numbers): per-device lists
    with NaN where a device was not measured, and the CU's own seconds per step."""
    nan = float("nan")
    devices, links = profile.devices, profile.links
    return {
        PROFILE_SECONDS_PER_SAMPLE_BLOCK: [d.seconds_per_sample_block if d else nan for d in devices],
        PROFILE_MICROBATCH_S: [d.microbatch_s if d else nan for d in devices],
        PROFILE_MEMORY_BYTES: [d.memory_bytes if d else nan for d in devices],
        PROFILE_LINK_BYTES_PER_S: [x.bytes_per_s if x else nan for x in links],
        PROFILE_LINK_LATENCY_S: [x.latency_s if x else nan for x in links],
        PROFILE_CU_STEP_S: profile.cu_step_s,
    }


def read_profile(metrics: dict, t: int) -> ClusterProfile | None:
    """The profile a CU's reply carries (None when it carries none); a malformed one raises ProfileError."""
    if PROFILE_CU_STEP_S not in metrics:
        return None
    lists = [metrics.get(key, []) for key in PROFILE_KEYS]
    if not all(isinstance(x, list) for x in lists) or len({len(x) for x in lists}) != 1:
        raise ProfileError(f"reply's profile lists {', '.join(PROFILE_KEYS)} must be lists of one length")
    s, c0, mem, rate, lat = lists
    try:
        devices = tuple(
            None if math.isnan(float(s[k])) else DeviceMeasurement(s[k], c0[k], mem[k]) for k in range(len(s))
        )
        links = tuple(None if math.isnan(float(rate[k])) else LinkMeasurement(rate[k], lat[k]) for k in range(len(s)))
        return ClusterProfile(devices, links, metrics[PROFILE_CU_STEP_S], measured_round=t)
    except (TypeError, ValueError) as err:
        if isinstance(err, ProfileError):
            raise
        raise ProfileError(f"reply's profile is malformed ({err})") from None


def hello_content(cluster_config: dict) -> RecordDict:
    """The hello message: the CU's part of the resolved config (``ClusterConfig.to_dict()``; a CU needs no copy
    of ``conf/``)."""
    return RecordDict({CLUSTER_CONFIG: ConfigRecord({"json": json.dumps(cluster_config)})})


def read_cluster_config(msg: Message) -> dict:
    """The cluster config of a hello message, as a mapping for ``config.build_cluster_config``."""
    record = msg.content.config_records.get(CLUSTER_CONFIG)
    if record is None:
        raise CollaPipeError("hello message lacks the cluster config; the server and CU run different versions")
    try:
        return dict(json.loads(str(record["json"])))
    except (KeyError, TypeError, ValueError) as err:
        raise CollaPipeError(
            f"malformed cluster config in the hello message ({err}); the server and CU run different versions"
        ) from None


@dataclass(frozen=True)
class ReleaseInstructions:
    """The run is over for a CU: how many devices K its cluster has (whose named actors to kill) and the key of
    its on-disk optimizer moments (fl/cu/cu_checkpoint.py), "" when the run kept none."""

    num_devices: int
    cu_state_key: str = ""


def release_content(release: ReleaseInstructions) -> RecordDict:
    info = ConfigRecord({RELEASE_NUM_DEVICES: int(release.num_devices), RELEASE_CU_STATE_KEY: release.cu_state_key})
    return RecordDict({RELEASE_INFO: info})


def read_release(msg: Message) -> ReleaseInstructions:
    """The release message's instructions (one-line CollaPipeError on a missing or malformed record)."""
    record = msg.content.config_records.get(RELEASE_INFO)
    try:
        if record is None:
            raise ValueError("no release record")
        num_devices = record[RELEASE_NUM_DEVICES]
        if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
            raise ValueError(f"{RELEASE_NUM_DEVICES}={num_devices!r} is not a device count >= 1")
        return ReleaseInstructions(num_devices, str(record.get(RELEASE_CU_STATE_KEY, "") or ""))
    except (KeyError, TypeError, ValueError) as err:
        raise CollaPipeError(f"malformed release message ({err}); the server and CU run different versions") from None
