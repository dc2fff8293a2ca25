"""Who may use the data plane: per-CU keys checked before any frame is read, replays refused."""

from __future__ import annotations

import threading

import grpc
import pytest

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.protocol import encode_step_request
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import (
    SECRET,
    Served,
    TokenHead,
    assert_same_state,
    exchange,
    make_step,
    raw_stream,
    snapshot,
)
from tests.tls_certs import self_signed


# ---------------------------------------------------------------------------------------------------
# who may use the data plane: per-CU keys checked before any frame is read, replays refused
# ---------------------------------------------------------------------------------------------------
def test_a_real_cu_is_served_while_32_unauthenticated_streams_are_open(served):
    idle = threading.Event()

    def never_send():
        idle.wait(20)
        yield b""

    opened = []
    for _ in range(32):
        channel, call = raw_stream(served.host.address, key="stolen-or-guessed")
        opened.append((channel, call(never_send())))
    try:
        for _, responses in opened:  # every one is refused when it starts, before a frame is read
            with pytest.raises(grpc.RpcError) as info:
                next(responses)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with served.client(0) as real:
            real(*make_step(50))
    finally:
        idle.set()
        for channel, _ in opened:
            channel.close()
    stats = served.host.stats()
    assert stats["clusters"][0]["steps"] == 1 and stats["unattributed"]["refused"] == 32


def test_a_cu_cannot_send_steps_as_another_cluster(served):
    z, mbs = make_step(51)
    # its own (valid) stream, but a frame claiming cluster 1 with cluster 0's key
    forged = encode_step_request(cluster_key(SECRET, 1, 0), 1, 1, 1, z, mbs)
    meta = exchange(served.host.address, forged, 1, 0)
    assert meta["kind"] == "error" and "wrong data-plane key" in meta["message"]
    # a frame for cluster 1 with cluster 1's key, sent on cluster 0's stream
    other = encode_step_request(cluster_key(SECRET, 1, 1), 1, 1, 1, z, mbs)
    assert "on the stream of round 1, cluster 0" in exchange(served.host.address, other, 1, 0)["message"]
    assert served.host.stats()["clusters"].get(1, {"steps": 0})["steps"] == 0


def test_replayed_and_reordered_steps_are_refused(served):
    z, mbs = make_step(52)
    frame = encode_step_request(cluster_key(SECRET, 1, 0), 1, 0, 5, z, mbs)
    assert exchange(served.host.address, frame)["kind"] == "reply"
    before_replay = snapshot(served.head, served.optimizer)
    for step_id in (5, 3):  # the same frame again (captured and replayed), then an older step id
        again = encode_step_request(cluster_key(SECRET, 1, 0), 1, 0, step_id, z, mbs)
        meta = exchange(served.host.address, again)
        assert meta["kind"] == "error" and "replayed or reordered" in meta["message"]
    assert_same_state(before_replay, snapshot(served.head, served.optimizer))  # one frame = one step, not two
    assert served.host.stats()["clusters"][0]["steps"] == 1


def test_tls_round_trip_on_loopback(tmp_path, transport):
    cert, key = self_signed(tmp_path)
    s = Served(TokenHead(), tls=(cert.read_bytes(), key.read_bytes()), transport=transport)
    try:
        z, mbs = make_step(60)
        with s.client(0, root_certificate=cert.read_text()) as secure:
            loss, _ = secure(z, mbs)
        ref_loss, _ = head_step(s.ref_head, s.ref_optimizer, z, mbs)
        assert abs(loss - ref_loss) <= 1e-6
        with s.client(1, timeout_s=10) as plaintext:  # a CU without TLS cannot talk to a TLS host
            with pytest.raises(DataPlaneError):
                plaintext(*make_step(61))
        other, _ = self_signed(tmp_path / "other")
        with s.client(1, timeout_s=10, root_certificate=other.read_text()) as untrusted:  # nor one trusting another
            with pytest.raises(DataPlaneError):
                untrusted(*make_step(62))
        assert s.host.stats()["clusters"][0]["steps"] == 1 and 1 not in s.host.stats()["clusters"]
    finally:
        s.host.stop(grace_s=0)
