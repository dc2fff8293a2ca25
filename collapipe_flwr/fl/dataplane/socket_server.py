"""The host's socket transport (``dataplane.transport: socket``): one plain TCP connection per CU stream.

Why hand-written: Python gRPC costs 3-4.7 CPU-ms to move 2 MiB each way on loopback with no data-plane code at
all (HTTP/2 framing, copies into and out of its core, thread hand-offs), more than the whole 3 ms budget of an
inline step (docs/benchmarks.md); no library kept by this project gives a framed exchange that sends the encoded
pieces without joining them, receives in place, and keeps the data plane's checks. This module is the stdlib
``socket`` / ``ssl`` doing just that, with every check the gRPC transport has:

- authentication before any frame is read: a connection opens with a hello frame (at most 4 KiB) carrying
  (t, n, key), checked by :meth:`Sessions.refusal` (HMAC key compared in constant time, round open, cluster
  selected; the gRPC interceptor's very decision) and answered by an ok or, for a refused one, a one-line error
  frame, then the connection is closed. An authenticated CU may hold ``max_streams_per_cluster`` streams; at most
  ``max_streams`` are served at once;
- keyless floods (silent, slow or junk connections) as gRPC holds them: see :mod:`.socket_gate`;
- per frame: the length prefix is checked against ``max_message_mb`` before a byte of the frame is read (an
  oversize one is answered with a one-line error and the connection closed, as gRPC's RESOURCE_EXHAUSTED ends its
  stream); the frame itself goes to :class:`~.stream_session.StreamSession` and :class:`~.frame_service.FrameService`
  unchanged (key in the header, round and cluster, increasing step ids, tensor checks, 1F1B parts, wire modes), whose
  error frames leave the connection usable;
- idle streams are reaped by the host's :class:`~.streams.StreamRegistry` (``cancel`` shuts the socket down,
  which ends its handler); a frame counts as arrived only once whole, so a CU that stops mid-frame is reaped too;
  keepalive probes notice a vanished machine; a CU that disconnects, even mid-frame, only ends its own handler;
- TLS when the host has a certificate (``ssl``, server-authenticated as the gRPC transport: the CU verifies the
  certificate it was sent; no client certificate), TLS 1.2 at least.

One thread per admitted connection (blocking reads, no event loop: a step is a strict request / reply on it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import tempfile
import threading
import time

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.protocol import error_frame
from collapipe_flwr.fl.dataplane.socket_gate import (
    BACKLOG,
    HELLO_TIMEOUT_S,
    MAX_PENDING,
    MAX_PENDING_PER_PEER,
    GateBounds,
    HelloGate,
    Who,
)
from collapipe_flwr.fl.dataplane.socket_wire import (
    HELLO_OK,
    PeerClosed,
    check_length,
    recv_body,
    recv_length,
    send_frame,
    tune,
)
from collapipe_flwr.fl.dataplane.stream_session import Sessions, StreamSession
from collapipe_flwr.fl.dataplane.transport import format_address

log = logging.getLogger(__name__)

DRAIN_S = 1.0  # after refusing an oversize frame: how long its bytes are read and dropped, so the error arrives


class _Conn:
    """One accepted connection: :meth:`cancel` (the reaper, a closed round, stop) shuts it down, which ends the
    blocking read of its handler thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.cancelled = False  # a shut-down socket reads as a clean close: this tells the two apart

    def cancel(self) -> None:
        self.cancelled = True
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # the plain socket's: leaves TLS state alone


def server_tls_context(tls: tuple[bytes, bytes]) -> ssl.SSLContext:
    """A server-side TLS context from (certificate PEM, key PEM); ``ssl`` reads them only from files, so they
    pass through a private temporary folder that is removed at once."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = tls
    with tempfile.TemporaryDirectory(prefix="cpdp-tls-") as folder:
        paths = []
        for name, pem in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            paths.append(path)
        try:
            context.load_cert_chain(paths[0], paths[1])
        except ssl.SSLError as err:
            raise DataPlaneError(
                f"cannot load the data plane's TLS certificate and key ({err.reason}); check dataplane.tls_cert/tls_key"
            ) from None
    return context


class SocketListener:
    """The data plane's TCP server on bind:port (TLS with ``tls`` = (certificate PEM, key PEM)).

    Its :class:`~.socket_gate.HelloGate` accepts connections and reads each one's TLS handshake and hello within
    ``hello_timeout_s``, ``max_pending`` and ``max_pending_per_peer``, then hands it to :meth:`_hello_done`, which
    admits or refuses it. An admitted connection gets its own handler thread (at most ``max_streams`` are served
    at once).
    """

    def __init__(
        self,
        sessions: Sessions,
        *,
        bind: str,
        port: int,
        tls: tuple[bytes, bytes] | None,
        max_streams: int,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        max_pending: int = MAX_PENDING,
        max_pending_per_peer: int = MAX_PENDING_PER_PEER,
    ) -> None:
        bounds = GateBounds(hello_timeout_s, max_pending, max_pending_per_peer)
        self._sessions = sessions
        self._bind, self._port = bind, int(port)
        self._max_streams = int(max_streams)
        context = server_tls_context(tls) if tls is not None else None
        self.gate = HelloGate(bounds, context, self._hello_done, sessions.refuse_unattributed)
        self._lock = threading.Lock()  # guards the sets and count below
        self._conns: set[_Conn] = set()
        self._threads: set[threading.Thread] = set()
        self._serving = 0  # authenticated streams being served

    # -- start / stop ------------------------------------------------------------------------------------------
    def start(self) -> int:
        family = socket.AF_INET6 if ":" in self._bind else socket.AF_INET
        try:
            sock = socket.create_server((self._bind.strip("[]"), self._port), family=family, backlog=BACKLOG)
        except OSError as err:
            raise DataPlaneError(
                f"cannot bind the data plane to {format_address(self._bind, self._port)} ({err.strerror}); choose a "
                "free dataplane.port or another dataplane.bind"
            ) from None
        port = sock.getsockname()[1]
        self.gate.start(sock)
        return port

    def stop(self, grace_s: float) -> None:
        """Stop accepting; open connections are shut down after ``grace_s`` s (at once when none is busy)."""
        if not self.gate.stop():
            return  # not started, or stopped already
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._serving:
            time.sleep(0.02)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            conn.cancel()
        for thread in threads:
            thread.join(timeout=5.0)

    # -- admission ---------------------------------------------------------------------------------------------
    def _hello_done(self, sock: socket.socket, who: Who) -> None:
        """Admit the connection that presented ``who`` (its handler thread takes it over) or refuse it with a
        one-line error frame (called in the gate's thread)."""
        why = self._sessions.refusal(who, "connection hello")
        if why is None and who is not None:
            stream = (who[0], who[1])
            with self._lock:
                if self._serving >= self._max_streams:
                    self._sessions.refuse_unattributed()
                    why = (
                        f"the decoder host already serves its maximum number of CU streams (max_streams="
                        f"{self._max_streams}); raise its max_streams"
                    )
                else:
                    conn = _Conn(sock)
                    session = self._sessions.open(stream, conn)
                    if session is not None:
                        self._serving += 1
                        thread = threading.Thread(
                            target=self._serve, args=(conn, session), name="decoder-host-conn", daemon=True
                        )
                        self._conns.add(conn)
                        self._threads.add(thread)
                        thread.start()
                        return
                    why = self._sessions.full(stream)
        with contextlib.suppress(OSError):  # a few hundred bytes into an empty send buffer: it does not block
            send_frame(sock, error_frame(None, why or "refused"))
        with contextlib.suppress(OSError):
            sock.close()

    # -- an admitted connection ------------------------------------------------------------------------------
    def _serve(self, conn: _Conn, session: StreamSession) -> None:
        """One admitted connection, in its own thread: the ok to its hello, then its frames until it ends."""
        try:
            conn.sock.setblocking(True)  # idleness is the reaper's: it shuts the socket down
            tune(conn.sock)
            send_frame(conn.sock, HELLO_OK)
            self._frames(conn, session)
        except (OSError, DataPlaneError) as err:  # the CU went away (mid-frame too), a cancel
            log.debug("data-plane connection ended: %s", err)
        finally:
            with self._lock:
                self._serving -= 1
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            session.close()
            with contextlib.suppress(OSError):
                conn.sock.close()

    def _frames(self, conn: _Conn, session: StreamSession) -> None:
        """Answer the connection's frames in order until the CU ends it (or it is cancelled)."""
        scratch = bytearray(8)
        while True:
            try:
                length = recv_length(conn.sock, scratch)
            except PeerClosed as closed:
                if not closed.clean:
                    raise
                if not conn.cancelled:
                    session.ended()  # the CU closed between frames: no more steps from it this round
                return
            try:
                check_length(length, self._sessions.max_bytes, "the CU")
            except DataPlaneError as err:
                self._sessions.refuse_unattributed()
                send_frame(conn.sock, error_frame(None, str(err)))
                _drain(conn.sock, length)
                return
            frame = recv_body(conn.sock, length)
            send_frame(conn.sock, session.answer(frame))


def _drain(sock: socket.socket, length: int) -> None:
    """Read and drop up to ``length`` bytes for at most :data:`DRAIN_S` s into a small buffer (no memory grows),
    so the refused CU's send completes and it reads the error before the connection closes."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_WR)
    scratch = memoryview(bytearray(1 << 16))
    deadline = time.monotonic() + DRAIN_S
    left = length
    with contextlib.suppress(OSError):
        while left > 0 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            k = sock.recv_into(scratch, min(left, len(scratch)))
            if not k:
                return
            left -= k
