"""The CU's message handlers (what ``client_app.py`` registers, each with the process's one ``CUStateStore``).

A :class:`~collapipe_flwr.errors.CollaPipeError` (bad node config, bad data file, refused data-plane
request, failed device) becomes an error reply carrying its one-line message, so the server logs what
went wrong on which CU and aggregates the others; anything else propagates as a Flower error.
"""

from __future__ import annotations

from flwr.app import Context, Error, Message, MetricRecord, RecordDict

from collapipe_flwr.errors import CannotContinue, CollaPipeError
from collapipe_flwr.fl.cu.cluster_client import ClusterIdentity, hello_metrics, release_run, train_round
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import (
    CANNOT_CONTINUE_CODE,
    DEVICE_ACTORS_RELEASED,
    HELLO_REPLY,
    RELEASE_REPLY,
    USER_ERROR_CODE,
    read_cluster_config,
    read_release,
    read_train,
    reply_content,
)


def _error_reply(msg: Message, err: CollaPipeError) -> Message:
    code = CANNOT_CONTINUE_CODE if isinstance(err, CannotContinue) else USER_ERROR_CODE
    return Message(Error(code=code, reason=str(err)), reply_to=msg)


def handle_hello(msg: Message, context: Context, store: CUStateStore) -> Message:
    """Say which cluster this SuperNode is and how many training examples it holds."""
    try:
        cluster_config = read_cluster_config(msg)
        identity = ClusterIdentity.from_node_config(context.node_config)
        metrics = hello_metrics(store, identity, cluster_config)
    except CollaPipeError as err:
        return _error_reply(msg, err)
    return Message(RecordDict({HELLO_REPLY: MetricRecord(metrics)}), reply_to=msg)


def handle_train(msg: Message, context: Context, store: CUStateStore) -> Message:
    """One round of local training (Algorithm 1, lines 5-23); replies with the encoder and its round report (flat
    on the wire: ``RoundReport.to_record``)."""
    try:
        identity = ClusterIdentity.from_node_config(context.node_config)
        weights, instructions = read_train(msg)
        reply_weights, report = train_round(
            store, identity, weights, instructions, state=context.state, run_id=msg.metadata.run_id
        )
    except CollaPipeError as err:
        return _error_reply(msg, err)
    return Message(reply_content(reply_weights, report.to_record()), reply_to=msg)


def handle_release(msg: Message, context: Context, store: CUStateStore) -> Message:
    """The run is over: kill this cluster's device actors of the run and forget its session."""
    try:
        identity = ClusterIdentity.from_node_config(context.node_config)
        release = read_release(msg)
        killed = release_run(store, identity, str(msg.metadata.run_id), release.num_devices, release.cu_state_key)
    except CollaPipeError as err:
        return _error_reply(msg, err)
    return Message(RecordDict({RELEASE_REPLY: MetricRecord({DEVICE_ACTORS_RELEASED: killed})}), reply_to=msg)
