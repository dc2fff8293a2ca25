"""The CU's socket transport (``dataplane.transport: socket``): one TCP connection per :class:`SocketConnection`.

Why hand-written: see :mod:`.socket_server` (Python gRPC alone costs more than the inline step's budget; no kept
library sends the encoded pieces unjoined and receives in place with these checks). The connection opens with
the CU's hello (its key for (t, n)), sent at once (the host gives a connection ``hello_timeout_s``, 1.5 s, for its
TLS handshake and hello, and under a keyless flood closes the oldest connections still without one first), and
waits for the host's ok, so a refusal (wrong key, closed round, too many streams) reaches the caller as the host's
one-line reason. Then each step is one length-prefixed frame out
(``sendmsg`` of the frame's pieces, TCP_NODELAY) and one back (``recv_into`` a buffer of the announced size,
checked against ``max_message_mb`` first). Every wait is bounded by ``timeout_s`` (the socket's timeout, reset to
what is left of the step's deadline before each read). TLS with the stdlib ``ssl`` when the train message
carried a certificate to trust (the host name is verified, as gRPC does).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.socket_wire import (
    PeerClosed,
    check_length,
    hello_frame,
    recv_body,
    recv_length,
    send_frame,
    tune,
)
from collapipe_flwr.fl.dataplane.wire import Frame, decode_header

REPLY_AFTER_FAILED_SEND_S = 1.0  # a host that refused a frame mid-send (oversize) answers within this


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` or ``[v6]:port``; a one-line error otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise DataPlaneError(f"data-plane address {address!r} is not host:port; check dataplane.host / port")
    return host.strip("[]"), int(port)


class SocketConnection:
    """One open, authenticated connection to the host."""

    def __init__(self, sock: socket.socket, address: str, timeout_s: float, max_bytes: int) -> None:
        self.sock, self.address, self.timeout_s, self.max_bytes = sock, address, timeout_s, max_bytes
        self.lost = False
        self._scratch = bytearray(8)  # the length prefix, reused
        self._dead = False  # the host closed (or refused a frame and will close) this connection

    def exchange(self, frame: Frame | bytes) -> bytearray:
        """Send ``frame`` and return the host's answer (its own buffer); every failure is a DataPlaneError."""
        deadline = time.monotonic() + self.timeout_s
        try:
            self.sock.settimeout(self.timeout_s)
            try:
                send_frame(self.sock, frame)
            except (TimeoutError, ssl.SSLError):
                raise
            except OSError as err:  # the host may have refused the frame and closed: its reason may be waiting
                self._dead = True
                deadline = min(deadline, time.monotonic() + REPLY_AFTER_FAILED_SEND_S)
                try:
                    return self._reply(deadline)
                except (OSError, DataPlaneError):
                    raise err from None
            return self._reply(deadline)
        except TimeoutError:
            raise DataPlaneError(
                f"no reply from the decoder host at {self.address} within timeout_s={self.timeout_s:g}; check the "
                "server or raise dataplane.timeout_s"
            ) from None
        except (OSError, ssl.SSLError) as err:
            self.lost = True
            raise DataPlaneError(
                f"the decoder host at {self.address} closed the data-plane connection ({_reason(err)}); the round may "
                "be closed"
            ) from None

    def _reply(self, deadline: float) -> bytearray:
        self.sock.settimeout(max(1e-3, deadline - time.monotonic()))
        length = recv_length(self.sock, self._scratch)
        check_length(length, self.max_bytes, "the decoder host")
        self.sock.settimeout(max(1e-3, deadline - time.monotonic()))
        return recv_body(self.sock, length)

    def ended(self) -> bool:
        """The host closed the connection (or something unexpected is waiting on it) since the last reply."""
        if self._dead:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self, cancel: bool) -> None:
        if not cancel:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self.sock, socket.SHUT_WR)  # a clean end the host reads as such
        with contextlib.suppress(OSError):
            self.sock.close()


class SocketDialer:
    """Opens connections to the host at ``address`` (TLS, trusting ``root_certificate``, when it is given)."""

    def __init__(self, address: str, root_certificate: str, max_message_mb: int, timeout_s: float) -> None:
        self.address, self.timeout_s = address, timeout_s
        self.host, self.port = split_address(address)
        self.max_bytes = int(max_message_mb) * 2**20
        self._tls: ssl.SSLContext | None = None
        if root_certificate:
            try:
                self._tls = ssl.create_default_context(cadata=root_certificate)
            except ssl.SSLError as err:
                raise DataPlaneError(
                    f"the data plane's TLS certificate from the train message cannot be loaded ({err.reason})"
                ) from None
            self._tls.minimum_version = ssl.TLSVersion.TLSv1_2

    def open(self, round_: int, cluster: int, key: str) -> SocketConnection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except TimeoutError:
            raise DataPlaneError(
                f"cannot reach the decoder host at {self.address} within timeout_s={self.timeout_s:g}; check "
                "dataplane.host / port and that the server is running"
            ) from None
        except OSError as err:
            raise DataPlaneError(
                f"cannot reach the decoder host at {self.address} ({_reason(err)}); check dataplane.host / port and "
                "that the server is running"
            ) from None
        try:
            tune(sock)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            conn = SocketConnection(sock, self.address, self.timeout_s, self.max_bytes)
            answer = conn.exchange(hello_frame(round_, cluster, key))
        except (OSError, ssl.SSLError) as err:
            sock.close()
            raise DataPlaneError(
                f"cannot open a data-plane connection to {self.address} ({_reason(err)}); check that CU and server "
                "use the same dataplane.transport and TLS settings"
            ) from None
        except DataPlaneError as err:
            sock.close()
            raise DataPlaneError(
                f"cannot open a data-plane connection to {self.address} ({err}); check that CU and server use the "
                "same dataplane.transport"
            ) from None
        meta = _header(answer)
        if meta.get("kind") == "hello" and meta.get("ok") is True:
            return conn
        sock.close()
        message = meta.get("message") if meta.get("kind") == "error" else "not a data-plane hello"
        raise DataPlaneError(f"the decoder host at {self.address} refused the data-plane connection: {message}")

    def close(self) -> None:
        pass


def _header(frame: bytearray) -> dict:
    try:
        return decode_header(frame)
    except DataPlaneError:
        return {"kind": "error", "message": "the host's answer is not a data-plane frame (another transport?)"}


def _reason(err: BaseException) -> str:
    if isinstance(err, PeerClosed):
        return str(err)
    if isinstance(err, ssl.SSLError):
        return f"TLS: {err.reason or err}"
    return " ".join(str(err.strerror or err).split()) if isinstance(err, OSError) else str(err)
