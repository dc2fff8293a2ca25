"""Framing of the socket transport (``dataplane.transport: socket``), shared by :mod:`.socket_server` and
:mod:`.socket_client`: every frame (a :mod:`.wire` frame) travels as ``length: u64 little-endian | frame``.

A frame goes out from its pieces (prefix, header, each tensor's bytes viewed in place) in ``sendmsg`` calls, no
join; over TLS, where ``sendmsg`` does not exist, piece by piece with ``sendall``. A frame comes in with
``recv_into`` straight into a buffer allocated once at its announced size, after that size was checked against
the receiver's cap, so a peer announcing a huge frame is refused before a byte of it is read. Each frame gets its
own buffer (not one reused for all): the decoded tensors view it in place (``wire.decode_frame`` of a bytearray),
and tensors of an earlier frame may still be in use (the caller's dL/dz_enc on the CU, part 0's fields of a 1F1B
step on the host) when the next frame arrives.

A connection opens with a *hello* frame from the CU (``{"kind": "hello", "round", "cluster", "key"}``, at most
:data:`HELLO_MAX_BYTES`) answered by ``{"kind": "hello", "ok": true}`` or an error frame.
"""

from __future__ import annotations

import socket
import ssl
import struct

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.wire import Frame, frame_of

LENGTH = struct.Struct("<Q")
HELLO_MAX_BYTES = 4096  # a hello is a few hundred bytes; an unauthenticated peer gets no bigger buffer
_IOV_BATCH = 512  # pieces per sendmsg call, under every platform's IOV_MAX (1024 on Linux)


class PeerClosed(ConnectionError):
    """The peer closed the connection (between frames: ``clean``; else mid-frame)."""

    def __init__(self, clean: bool) -> None:
        super().__init__("the peer closed the connection" + ("" if clean else " mid-frame"))
        self.clean = clean


def tune(sock: socket.socket) -> None:
    """TCP_NODELAY (a frame's tail is not held back waiting for an ACK) and keepalive probes, so a peer whose
    machine vanished is noticed within ~40 s (as gRPC's keepalive pings)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 20), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def hello_frame(round_: int, cluster: int, key: str) -> Frame:
    return frame_of({"kind": "hello", "round": int(round_), "cluster": int(cluster), "key": str(key)}, [])


def hello_identity(meta: dict) -> tuple[int, int, str] | None:
    """(t, n, key) of a hello frame's header, None when it is not a well-formed hello."""
    round_, cluster, key = meta.get("round"), meta.get("cluster"), meta.get("key")
    if meta.get("kind") != "hello" or not isinstance(key, str):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (round_, cluster)):
        return None
    return int(round_), int(cluster), key  # type: ignore[arg-type]  # checked to be ints above


HELLO_OK = frame_of({"kind": "hello", "ok": True}, [])


def send_frame(sock: socket.socket, frame: Frame | bytes) -> None:
    """Send one length-prefixed frame from its pieces (raises OSError when the connection fails)."""
    pieces = frame.pieces if isinstance(frame, Frame) else [frame]
    head = LENGTH.pack(len(frame))
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(head)
        for piece in pieces:
            sock.sendall(piece)
        return
    views = [memoryview(head), *(memoryview(p) for p in pieces)]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + _IOV_BATCH])
        while sent:  # skip what went out; a piece sent in part continues from where it stopped
            n = views[i].nbytes
            if sent >= n:
                sent -= n
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0


def recv_exact(sock: socket.socket, view: memoryview, clean_at_start: bool = False) -> None:
    """Fill ``view`` from the socket; :class:`PeerClosed` when the peer closes first (``clean`` when it closed
    before the first byte and ``clean_at_start``)."""
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise PeerClosed(clean_at_start and got == 0)
        got += k


def recv_length(sock: socket.socket, scratch: bytearray) -> int:
    """The next frame's announced length (``scratch``: 8 bytes, reused); PeerClosed(clean) at a clean end."""
    recv_exact(sock, memoryview(scratch), clean_at_start=True)
    return LENGTH.unpack(scratch)[0]


def recv_body(sock: socket.socket, length: int) -> bytearray:
    """The frame of ``length`` bytes (already checked against the cap), in a buffer of its own."""
    buf = bytearray(length)
    recv_exact(sock, memoryview(buf))
    return buf


def check_length(length: int, max_bytes: int, who: str) -> None:
    """One-line refusal of a frame announced larger than the cap, before any of it is read."""
    if length > max_bytes:
        raise DataPlaneError(
            f"{who} announced a frame of {length / 2**20:.1f} MiB, over dataplane.max_message_mb="
            f"{max_bytes // 2**20}; raise it on server and CUs, use more micro-batches, or set dataplane.compression"
        )
