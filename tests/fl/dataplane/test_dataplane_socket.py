"""The socket transport (``dataplane.transport: socket``) at the byte level: what a raw TCP peer can and cannot
do to the decoder host, and the same numbers as the gRPC transport for the same head and inputs."""

from __future__ import annotations

import copy
import socket
import time

import pytest
import torch

from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.protocol import encode_step_request
from collapipe_flwr.fl.dataplane.socket_wire import LENGTH, hello_frame
from collapipe_flwr.fl.dataplane.wire import decode_frame
from collapipe_flwr.fl.server.decoder.host import DecoderHost
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from tests.dataplane_helpers import MAX_LEN, SECRET, Served, TokenHead, assert_same_state, make_step, snapshot


class PartsHead(TokenHead):
    """TokenHead with the target count 1F1B needs before the forward (models/split.TaskHead's)."""

    def target_count(self, attention_mask, batch):
        return (batch["labels"] != -100).sum()


@pytest.fixture
def served():
    s = Served(TokenHead(), max_len=MAX_LEN, max_message_mb=4, transport="socket")
    yield s
    s.host.stop(grace_s=0)


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _send(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(LENGTH.pack(len(frame)) + frame)


def _read(sock: socket.socket) -> dict:
    """The next frame's header; {} when the host closed the connection."""
    head = b""
    while len(head) < LENGTH.size:
        chunk = sock.recv(LENGTH.size - len(head))
        if not chunk:
            return {}
        head += chunk
    (length,) = LENGTH.unpack(head)
    body = bytearray()
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return {}
        body += chunk
    return decode_frame(bytes(body))[0]


def _hello(address: str, round_: int = 1, cluster: int = 0, key: str | None = None) -> tuple[socket.socket, dict]:
    sock = _connect(address)
    _send(sock, hello_frame(round_, cluster, cluster_key(SECRET, round_, cluster) if key is None else key).tobytes())
    return sock, _read(sock)


def test_a_wrong_key_is_refused_in_the_hello_before_any_frame(served):
    for key in ("guessed", cluster_key(SECRET, 1, 1)):  # a made-up key; cluster 1's key presented as cluster 0
        sock, answer = _hello(served.host.address, key=key)
        with sock:
            assert answer["kind"] == "error" and "no valid data-plane key in the connection hello" in answer["message"]
            z, mbs = make_step(1)  # a frame sent anyway is never read: the host has closed the connection
            with pytest.raises(OSError):
                for _ in range(50):
                    _send(sock, encode_step_request(key, 1, 0, 1, z, mbs))
                    time.sleep(0.01)
    sock, answer = _hello(served.host.address, round_=1, cluster=5)  # a valid key of a cluster not selected
    sock.close()
    assert answer["kind"] == "error" and "cluster 5 is not selected" in answer["message"]
    stats = served.host.stats()
    assert stats["unattributed"]["refused"] == 3 and stats["clusters"] == {}
    with served.client(0) as cu:  # a real CU is served beside them
        cu(*make_step(2))


def test_an_oversize_length_prefix_is_refused_before_the_frame_is_read(served):
    """250 MB announced on an authenticated connection (cap 4 MB): a one-line error, no 250 MB buffer."""
    import psutil

    me = psutil.Process()
    before = me.memory_info().rss
    sock, answer = _hello(served.host.address)
    with sock:
        assert answer == {"kind": "hello", "ok": True}
        sock.sendall(LENGTH.pack(250 * 2**20) + b"CPDP")  # only the prefix and 4 bytes of the frame
        refusal = _read(sock)
        assert refusal["kind"] == "error" and "\n" not in refusal["message"]
        assert "250.0 MiB, over dataplane.max_message_mb=4" in refusal["message"]
        assert _read(sock) == {}  # then the host closes the connection
    assert (me.memory_info().rss - before) / 2**20 < 50
    with served.client(0) as cu:  # the CU reopens and is served
        cu(*make_step(3))
    assert served.host.stats()["clusters"][0]["steps"] == 1


def test_a_cu_that_vanishes_mid_frame_ends_only_its_own_connection(served):
    z, mbs = make_step(4)
    frame = encode_step_request(cluster_key(SECRET, 1, 0), 1, 0, 1, z, mbs)
    sock, answer = _hello(served.host.address, cluster=0)
    assert answer.get("ok") is True
    sock.sendall(LENGTH.pack(len(frame)) + frame[: len(frame) // 2])  # half a step, then gone
    sock.close()
    with served.client(1) as other, served.client(0) as again:  # the other cluster, and cluster 0 itself, go on
        other(*make_step(5))
        again(*make_step(6))
    deadline = time.time() + 5
    while served.host._streams._open_per_cluster and time.time() < deadline:  # every handler ended and released
        time.sleep(0.05)
    assert not served.host._streams._open_per_cluster
    stats = served.host.stats()["clusters"]
    assert stats[0]["steps"] == 1 and stats[1]["steps"] == 1  # the half step never ran


def test_steps_on_another_cluster_s_connection_and_replays_are_refused(served):
    z, mbs = make_step(7)
    sock, answer = _hello(served.host.address, cluster=0)
    with sock:
        assert answer.get("ok") is True
        other = encode_step_request(cluster_key(SECRET, 1, 1), 1, 1, 1, z, mbs)
        _send(sock, other)
        assert "on the stream of round 1, cluster 0" in _read(sock)["message"]
        own = encode_step_request(cluster_key(SECRET, 1, 0), 1, 0, 5, z, mbs)
        _send(sock, own)
        assert _read(sock)["kind"] == "reply"
        before = snapshot(served.head, served.optimizer)
        _send(sock, own)  # the same frame again, on the same (still usable) connection
        assert "replayed or reordered" in _read(sock)["message"]
        assert_same_state(before, snapshot(served.head, served.optimizer))


def test_a_connection_that_sends_no_hello_is_closed(served):
    served.host._listener.gate.bounds.hello_timeout_s = 0.3  # type: ignore[union-attr]
    sock = _connect(served.host.address)
    with sock:
        t0 = time.time()
        assert sock.recv(1) == b""  # closed by the host, no frame read
        assert time.time() - t0 < 5


@pytest.mark.parametrize("compression", ["none", "fp16", "int8"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_socket_gives_the_grpc_transport_s_gradients_to_the_bit(compression, schedule):
    """The same head, optimizer and steps behind both transports: losses, dL/dz_enc and head weights equal."""
    torch.manual_seed(0)
    head = PartsHead()
    out = {}
    for transport in ("grpc", "socket"):
        own = copy.deepcopy(head)
        host = DecoderHost(
            own,
            torch.optim.Adam(own.parameters(), lr=1e-2),
            SECRET,
            DecoderHostSpec(hidden_size=16, bind="127.0.0.1", compression=compression, transport=transport),
        )
        host.start()
        host.open_round(1, [0])
        results = []
        try:
            spec = DecoderClientSpec(compression=compression, transport=transport)
            with DecoderClient(host.address, cluster_key(SECRET, 1, 0), 1, 0, spec) as cu:
                for k in range(3):
                    z, mbs = make_step(40 + k, m=2)
                    if schedule == "gpipe":
                        results.append(cu(z, mbs))
                    else:
                        cu.begin_step(mbs)
                        grads = [cu.micro_step(i, z[i]) for i in range(len(z))]
                        results.append((cu.end_step(), grads))
        finally:
            host.stop(grace_s=0)
        out[transport] = (results, [p.detach().clone() for p in own.parameters()])
    (grpc_results, grpc_weights), (socket_results, socket_weights) = out["grpc"], out["socket"]
    for (la, ga), (lb, gb) in zip(grpc_results, socket_results):
        assert la == lb
        assert all(torch.equal(a, b) for a, b in zip(ga, gb))
    assert all(torch.equal(a, b) for a, b in zip(grpc_weights, socket_weights))
