"""The one interface between the data plane and the transport that moves its frames (``dataplane.transport``).

The data plane's work is transport-free: :class:`~.frame_service.FrameService` turns one request frame into one
reply frame, :class:`~.stream_session.StreamSession` serves one CU's stream of them, and the client
(:class:`~.client.DecoderClient`) numbers steps and decodes replies. What a transport adds is only how a CU's
stream is opened (with its per-round key, checked before any frame is read), how frames travel on it, and how
the host ends it. Both ends talk to a transport through the small protocols below; :mod:`.server` and
:mod:`.client` are the only modules that pick one by name:

- ``socket`` (the default, :mod:`.socket_server`, :mod:`.socket_client`): one TCP connection per CU (TLS by the
  stdlib ``ssl``), length-prefixed frames sent from their pieces and received in place; the lowest latency, and
  held against the same attacks as gRPC (every data-plane attack test runs over both: keyless and wrong-key
  streams, replays, oversized frames, keyless connection floods);
- ``grpc`` (:mod:`.grpc_server`, :mod:`.grpc_client`): one gRPC bidirectional stream per CU; the choice when the
  path to the server runs through HTTP/2 proxies or load balancers.
"""

from __future__ import annotations

from typing import Protocol

from collapipe_flwr.config.sections import Transport
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.wire import Frame

TRANSPORTS = tuple(Transport)
DEFAULT_TRANSPORT = Transport.SOCKET  # config.sections.DataPlaneSpec.transport's default too


def check_transport(name: str) -> Transport:
    """``name`` as its :class:`Transport`, else a one-line :class:`DataPlaneError`."""
    try:
        return Transport(name)
    except ValueError:
        raise DataPlaneError(f"dataplane.transport={name!r}; use one of {', '.join(Transport)}") from None


class Cancellable(Protocol):
    """The host's handle on one open CU stream: :meth:`cancel` ends it (the CU reopens on its next step)."""

    def cancel(self) -> None: ...


class Listener(Protocol):
    """The host's end of a transport: accepts CU streams and hands each one's frames to a StreamSession."""

    def start(self) -> int:
        """Start listening; the bound port (a free one for port 0)."""
        ...

    def stop(self, grace_s: float) -> None:
        """Stop accepting; open streams are ended after ``grace_s`` seconds."""
        ...


class Connection(Protocol):
    """A CU's open stream. ``lost`` tells, after :meth:`exchange` raised, whether the stream ended under the
    step (the host cancelled or closed it, the link dropped) rather than a timeout or a refusal: then the step may
    be resent once on a fresh stream (the host's increasing-step-id check refuses it if it was served)."""

    lost: bool

    def exchange(self, frame: Frame | bytes) -> bytes | bytearray:
        """Send one request frame and return the host's answer; every failure is a :class:`DataPlaneError`."""
        ...

    def ended(self) -> bool:
        """The host ended this stream while it was idle (e.g. reaped it): open a fresh one before sending."""
        ...

    def close(self, cancel: bool) -> None:
        """End the stream: ``cancel`` at once, or let the host see a clean end."""
        ...


class Dialer(Protocol):
    """A CU's end of a transport: opens streams to one host address."""

    def open(self, round_: int, cluster: int, key: str) -> Connection:
        """A new stream of cluster n in round t, authenticated by its key."""
        ...

    def close(self) -> None: ...
