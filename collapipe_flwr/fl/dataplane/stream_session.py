"""One CU stream on the decoder host, whatever transport carries it: who may open one, and its frames in order.

:class:`Sessions` is what the host hands its transport's listener: :meth:`Sessions.refusal` decides, from the
(t, n, key) a stream presents before any frame is read, whether it may open (the same decision for the gRPC
interceptor and the socket hello), and :meth:`Sessions.open` starts a :class:`StreamSession` unless cluster n
already holds its share of streams. A session answers each request frame (inline, or a pointer into the CU's
shared memory, :mod:`.shm`) through its :class:`FrameServer` (the server's decoder, ``fl/server/decoder/
frame_service.py``), keeping the stream's idle clock and round in
the host's :class:`~.streams.StreamRegistry`, so both transports are reaped, counted and refused alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import refusal
from collapipe_flwr.fl.dataplane.backend import Cancellable
from collapipe_flwr.fl.dataplane.protocol import error_frame
from collapipe_flwr.fl.dataplane.shm import HostSegments, read_pointer
from collapipe_flwr.fl.dataplane.stats import HostCounters
from collapipe_flwr.fl.dataplane.streams import StreamRegistry
from collapipe_flwr.fl.dataplane.wire import Frame


class FrameServer(Protocol):
    """What answers a stream's frames: the server's decoder (``fl/server/decoder/frame_service.py``), which the
    transport knows only by these three calls."""

    def serve(self, frame: bytes | bytearray, stream: tuple[int, int] | None = None) -> tuple[Frame, int | None]:
        """(reply or error frame, the step's round t or None when refused) for one request frame."""

    def stream_ended(self, stream: tuple[int, int] | None) -> None:
        """The CU of (t, n) = ``stream`` ended its stream cleanly."""

    def not_admitted(self, round_: int, cluster: int) -> str | None:
        """Why a stream of cluster n in round t may not open now, None when it may."""


class StreamSession:
    """The frames of one open stream of (t, n) = ``stream``, whose transport handle is ``handle``."""

    def __init__(
        self,
        frames: FrameServer,
        streams: StreamRegistry,
        handle: Cancellable,
        stream: tuple[int, int] | None,
        max_bytes: int,
    ) -> None:
        self._frames, self._streams, self._handle, self._stream = frames, streams, handle, stream
        self._registered: int | None = None
        # the CU's shared-memory segments (same-host shortcut), no frame larger than the host's cap
        self._segments = HostSegments(max_bytes=max_bytes)
        streams.mark_idle(handle)

    def answer(self, raw: bytes | bytearray) -> Frame | bytes:
        """The reply (or one-line error) frame to one request frame; a ``bytearray`` is the transport's own copy
        of the frame, decoded in place."""
        self._streams.mark_idle(self._handle, busy=True)
        frame: bytes | bytearray = raw
        try:
            pointer = read_pointer(frame)
            if pointer is not None:
                frame = self._segments.read(*pointer)  # a bytearray: the host's own copy out of the CU's segment
        except DataPlaneError as err:  # before the step is claimed: the CU may resend it inline
            self._streams.mark_idle(self._handle, refused=True)
            return error_frame(None, str(err))
        answer, round_ = self._frames.serve(frame, self._stream)
        reply = self._segments.reply(pointer[0], answer) if pointer is not None else answer
        if self._registered is None and round_ is not None:
            self._registered = round_
            self._streams.register(round_, self._handle)
        self._streams.mark_idle(self._handle, refused=round_ is None)
        return reply

    def ended(self) -> None:
        """The CU ended the stream cleanly (its client closed it: no more steps from it this round; under
        ``federation.decoder_update: ordered`` its cluster leaves the order). Not called for a cancelled stream."""
        self._frames.stream_ended(self._stream)

    def close(self) -> None:
        """The stream ended: detach the CU's segments and give back its place in the registry."""
        self._segments.close()
        self._streams.release(self._handle, self._registered, self._stream)


class Sessions:
    """What a listener needs from the host: the admission decision, counters, and sessions for admitted streams."""

    def __init__(
        self,
        secret: bytes,
        frames: FrameServer,
        streams: StreamRegistry,
        counters: HostCounters,
        max_message_mb: int,
    ) -> None:
        self._secret, self._frames, self._streams, self._counters = secret, frames, streams, counters
        self.max_message_mb = int(max_message_mb)
        self.max_bytes = self.max_message_mb * 2**20

    @property
    def secret(self) -> bytes:
        return self._secret

    @property
    def not_admitted(self) -> Callable[[int, int], str | None]:
        """(t, n) -> why round t / cluster n opens no stream now (None: it may)."""
        return self._frames.not_admitted

    def refuse_unattributed(self) -> None:
        """Count a stream or frame refused before it could be attributed to a cluster."""
        self._counters.refuse_unattributed()

    def refusal(self, who: tuple[int, int, str] | None, carrier: str) -> str | None:
        """Why a stream presenting (t, n, key) = ``who`` may not open (counted as an unattributed refusal), or None."""
        why = refusal(self._secret, who, self._frames.not_admitted, carrier)
        if why is not None:
            self.refuse_unattributed()
        return why

    def open(self, stream: tuple[int, int] | None, handle: Cancellable) -> StreamSession | None:
        """A session for an admitted stream of (t, n); None when cluster n already holds its share of streams."""
        if not self._streams.open(stream):
            return None
        return StreamSession(self._frames, self._streams, handle, stream, self.max_bytes)

    def full(self, stream: tuple[int, int] | None) -> str:
        """The one-line refusal of a stream of a cluster that already holds its share."""
        return (
            f"cluster {stream[1] if stream else '?'} already has {self._streams.max_per_cluster} open data-plane "
            "streams; a CU needs one (close the others)"
        )
