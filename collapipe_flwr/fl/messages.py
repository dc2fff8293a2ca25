"""What travels in Flower messages (control and weights, once per round; never per step): the message
types, every record key, and the pack / read helpers. Nothing else in the package spells these strings.

train (server -> CU):   RecordDict{WEIGHTS: ArrayRecord, INSTRUCTIONS: ConfigRecord{"json": str}}
train reply (CU -> server): RecordDict{WEIGHTS: ArrayRecord, METRICS: MetricRecord}
query.hello (server -> CU): RecordDict{RUN_CONFIG: ConfigRecord{"json": str}}; reply
    RecordDict{HELLO_REPLY: MetricRecord{PARTITION_ID, NUM_PARTITIONS, NUM_EXAMPLES}}
query.release (server -> CU, after the last round): RecordDict{RUN_CONFIG: ConfigRecord{"json": {RELEASE_NUM_DEVICES}}};
    reply RecordDict{RELEASE_REPLY: MetricRecord{DEVICE_ACTORS_RELEASED}}

Weights are one flat state dict whose names start with ``embedding.``, ``encoder.`` (the concatenated
segments, eq. 4) and, for methods that train the head on the CU, ``head.``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from collapipe_flwr.dssra.plan import ClusterPlan
from collapipe_flwr.errors import CollaPipeError

# ----------------------------------------------------------------------------- message types
TRAIN = MessageType.TRAIN
HELLO_ACTION = "hello"  # client_app: @app.query(HELLO_ACTION)
RELEASE_ACTION = "release"  # client_app: @app.query(RELEASE_ACTION)
HELLO = f"{MessageType.QUERY}.{HELLO_ACTION}"
RELEASE = f"{MessageType.QUERY}.{RELEASE_ACTION}"

# ----------------------------------------------------------------------------- record keys
WEIGHTS = "weights"
INSTRUCTIONS = "instructions"
METRICS = "metrics"
RUN_CONFIG = "run-config"
HELLO_REPLY = "hello"
RELEASE_REPLY = "release"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"
RELEASE_NUM_DEVICES = "release-num-devices"
DEVICE_ACTORS_RELEASED = "device-actors-released"
PARTS = ("embedding", "encoder", "head")


def pack_weights(parts: dict[str, dict[str, torch.Tensor]]) -> ArrayRecord:
    """{"embedding": sd, "encoder": sd, ...} -> one ArrayRecord with prefixed names."""
    flat = {}
    for part, sd in parts.items():
        if part not in PARTS:
            raise ValueError(f"unknown weight part {part!r}")
        for name, tensor in sd.items():
            flat[f"{part}.{name}"] = tensor.detach().cpu().contiguous()
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
    cluster_config: dict  # ClusterConfig.to_dict(): the part of the run config a CU uses
    devices: list[dict]
    dataplane_address: str = ""
    dataplane_secret: str = ""  # this CU's own data-plane key for this round (fl/dataplane/auth.py)
    dataplane_root_certificate: str = ""  # PEM the CU trusts for the data plane's TLS ("" = plaintext)
    replan: dict | None = None  # Sub-1's inputs for this cluster (dssra/replan.py), for a device lost mid-round

    def to_record(self) -> ConfigRecord:
        payload = {
            "round": self.round,
            "plan": self.plan.to_dict(),
            "cluster_config": self.cluster_config,
            "devices": self.devices,
            "dataplane_address": self.dataplane_address,
            "dataplane_secret": self.dataplane_secret,
            "dataplane_root_certificate": self.dataplane_root_certificate,
            "replan": self.replan,
        }
        return ConfigRecord({"json": json.dumps(payload)})

    @classmethod
    def from_record(cls, record: ConfigRecord) -> TrainInstructions:
        try:
            payload = json.loads(str(record["json"]))
            return cls(
                round=int(payload["round"]),
                plan=ClusterPlan.from_dict(payload["plan"]),
                cluster_config=dict(payload["cluster_config"]),
                devices=list(payload["devices"]),
                dataplane_address=str(payload.get("dataplane_address", "")),
                dataplane_secret=str(payload.get("dataplane_secret", "")),
                dataplane_root_certificate=str(payload.get("dataplane_root_certificate", "")),
                replan=payload.get("replan"),
            )
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
        raise CollaPipeError(f"CU on node {msg.metadata.src_node_id} failed: {msg.error.reason}")
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


def run_config_record(run_config: dict) -> ConfigRecord:
    """A JSON mapping as a ConfigRecord: the CU's part of the resolved run config in a hello message (a CU
    needs no copy of ``conf/``), the number of devices in a release message."""
    return ConfigRecord({"json": json.dumps(run_config)})


def read_run_config(msg: Message) -> dict:
    record = msg.content.config_records.get(RUN_CONFIG)
    if record is None:
        raise CollaPipeError("hello message lacks the run config; the server and CU run different versions")
    try:
        return dict(json.loads(str(record["json"])))
    except (KeyError, TypeError, ValueError) as err:
        raise CollaPipeError(
            f"malformed run config in the hello message ({err}); the server and CU run different versions"
        ) from None
