"""A CU answers bad input (node config, message) with a one-line error reply, never a crash."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.cu import client_main
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import TrainInstructions


def _context(node_config: dict) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


@pytest.mark.parametrize(
    "node_config,needle",
    [
        ({}, "partition-id"),
        ({"partition-id": 3, "num-partitions": 2}, "partition-id=3"),
        ({"partition-id": "x", "num-partitions": 2}, "partition-id"),
    ],
)
def test_bad_node_config_is_one_line(node_config, needle):
    with pytest.raises(ConfigError) as err:
        ClusterIdentity.from_node_config(node_config)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_node_data_dir_wins(monkeypatch):
    monkeypatch.setenv("COLLAPIPE_DATA_DIR", "/env/data")
    assert ClusterIdentity.from_node_config({"partition-id": 0, "num-partitions": 1}).data_dir == "/env/data"
    node = {"partition-id": 0, "num-partitions": 1, "data-dir": "/node/data"}
    assert ClusterIdentity.from_node_config(node).data_dir == "/node/data"


def test_malformed_instructions_are_refused():
    with pytest.raises(CollaPipeError) as err:
        TrainInstructions.from_record(ConfigRecord({"json": '{"round": 1}'}))
    assert "different versions" in str(err.value)


@pytest.fixture
def in_a_run(monkeypatch):
    """Messages can only be built inside a run: give this process the identity a SuperNode would."""
    from collapipe_flwr.flower_internals import TaskIdentity

    for key, value in (("run_id", 1), ("node_id", 1), ("task_id", 1)):
        monkeypatch.setattr(TaskIdentity, f"_{key}", value, raising=False)


@pytest.mark.parametrize("handler", [client_main.handle_train, client_main.handle_hello])
def test_handlers_reply_with_an_error_not_a_crash(handler, in_a_run):
    msg = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    reply = handler(msg, _context({"partition-id": 0, "num-partitions": 2}), CUStateStore())
    assert reply.has_error()
    assert reply.error.code == client_main.USER_ERROR_CODE
    assert "\n" not in reply.error.reason and "lacks" in reply.error.reason


def test_cu_reuses_its_task_until_the_config_changes(data_dir):
    from collapipe_flwr.config import load_run_config

    cached_task = CUStateStore().cached_task
    base = ["task=classification", "model=bert_tiny", "federation=tiny", "network=small"]
    first = cached_task(load_run_config(base, data_dir=str(data_dir)))
    assert cached_task(load_run_config(base, data_dir=str(data_dir))) is first
    other = cached_task(load_run_config(base + ["task.max_len=24"], data_dir=str(data_dir)))
    assert other is not first and other.max_len == 24
    assert cached_task(load_run_config(base + ["seed=3"], data_dir=str(data_dir))) is not other


@pytest.mark.parametrize(
    "record,needle",
    [
        (None, "no release record"),
        ({"release-cu-state-key": "k"}, "release-num-devices"),
        ({"release-num-devices": 0}, "release-num-devices=0"),
        ({"release-num-devices": "4"}, "release-num-devices='4'"),
    ],
)
def test_a_malformed_release_is_an_error_reply_not_a_guess(record, needle, in_a_run):
    """A release without a usable device count is refused (it used to fall back to 64 devices)."""
    content = RecordDict({} if record is None else {"release-info": ConfigRecord(record)})
    msg = Message(content, dst_node_id=7, message_type=f"{MessageType.QUERY}.release")
    reply = client_main.handle_release(msg, _context({"partition-id": 0, "num-partitions": 2}), CUStateStore())
    assert reply.has_error() and reply.error.code == client_main.USER_ERROR_CODE
    assert needle in reply.error.reason and "\n" not in reply.error.reason


def test_release_instructions_travel_unchanged(in_a_run):
    from collapipe_flwr.fl.messages import ReleaseInstructions, read_release, release_content

    sent = ReleaseInstructions(num_devices=3, cu_state_key="abc123")
    msg = Message(release_content(sent), dst_node_id=7, message_type=f"{MessageType.QUERY}.release")
    assert read_release(msg) == sent


def test_a_label_histogram_must_be_counts():
    from flwr.app import MetricRecord

    from collapipe_flwr.fl.messages import LABEL_HISTOGRAM, metric_counts

    assert metric_counts(MetricRecord({LABEL_HISTOGRAM: [3, 0, 5]}), LABEL_HISTOGRAM, 7) == [3, 0, 5]
    assert metric_counts(MetricRecord({}), LABEL_HISTOGRAM, 7) == []  # an older CU sends none
    for bad in ([1.5, 2.0], [-1, 2], 4):
        with pytest.raises(CollaPipeError, match="label-histogram.*expected a list of counts"):
            metric_counts(MetricRecord({LABEL_HISTOGRAM: bad}), LABEL_HISTOGRAM, 7)
