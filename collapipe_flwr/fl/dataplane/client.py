"""The CU's end of the data plane: a remote :data:`HeadFn` (docs/contracts.md).

``DecoderClient(...)(z_enc, micro_batches) -> (loss, grads)`` sends the m encoder outputs z_enc and the
micro-batch fields the head needs (all but ``input_ids``) to the server's decoder (Algorithm 1, line 11)
and returns the step loss and dL/dz_enc per micro-batch (line 15), as float32 tensors.

Transport (``transport``: ``grpc``, :mod:`.grpc_client`, or ``socket``, :mod:`.socket_client`, reached only
through :class:`~.backend.Dialer` / :class:`~.backend.Connection`): one stream per client (so per CU per round),
opened on the first step with the CU's key; every wait for a reply is bounded by ``timeout_s``. A failed or
timed-out stream is dropped and a fresh one is opened by the next step; every failure reaches the caller as
:class:`DataPlaneError`.

One resend: the host ends a stream it finds idle for ``idle_timeout_s`` (or the link drops), and that can happen
just after the client checked the stream and while it sends the next step, so the step fails although nothing is
wrong. When a stream that an earlier step used ends under a step (the transport reports it *lost*: cancelled or
closed by the host, not a timeout and not a refusal), the step is sent once more on a fresh stream. That is safe
under the host's increasing-step-id check: a step the host did serve before its stream ended is refused as a
replay (the CU gets that error), never applied twice; a step on a stream opened for it is not resent.

Under ``pipeline.schedule: 1f1b`` the client is also a :class:`~collapipe_flwr.pipeline.head.MicroHead`:
``begin_step(micro_batches)`` numbers the step, ``micro_step(i, z_enc_i)`` sends micro-batch i as part i of it
(part 0 with every micro-batch's fields) and returns its dL/dz_enc, ``end_step()`` returns the step loss the
reply to the last part carried (the server updated its decoder once, with that part).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch

from collapipe_flwr.config.sections import SharedMemory, Transport
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.backend import DEFAULT_TRANSPORT, Connection, Dialer, check_transport
from collapipe_flwr.fl.dataplane.grpc_client import GrpcDialer
from collapipe_flwr.fl.dataplane.protocol import (
    StepReply,
    decode_reply,
    part_request_frame,
    restarting,
    step_request_frame,
    wire_mode,
)
from collapipe_flwr.fl.dataplane.shm import ClientSegment, is_loopback, read_pointer, shm_room_for
from collapipe_flwr.fl.dataplane.socket_client import SocketDialer
from collapipe_flwr.fl.dataplane.transport import MB
from collapipe_flwr.fl.dataplane.wire import Frame, decode_header

log = logging.getLogger(__name__)


# dataplane.transport -> what dials the host
DIALERS: dict[Transport, type[SocketDialer] | type[GrpcDialer]] = {
    Transport.SOCKET: SocketDialer,
    Transport.GRPC: GrpcDialer,
}


@dataclass(frozen=True)
class DecoderClientSpec:
    """How a CU's client talks to the decoder host (every field a plain setting, the ``dataplane`` section's;
    :class:`DecoderClient` checks them): ``timeout_s`` bounds every wait for a reply; ``max_message_mb`` is the
    largest frame either end accepts; ``compression`` the wire codec of z_enc and dL/dz_enc (none | fp16 | int8);
    ``shared_memory`` (auto | off) the same-host shortcut; ``transport`` grpc | socket."""

    timeout_s: float = 120
    max_message_mb: int = 256
    compression: str = "none"
    shared_memory: str = "off"
    transport: str = DEFAULT_TRANSPORT


class DecoderClient:
    """Remote head for cluster ``cluster`` in round ``round`` at ``address`` (host:port), with the CU's key
    ``secret``, set up as ``spec`` says; step ids continue from ``start_seq``; ``root_certificate`` (PEM, the one
    the train message carried): TLS, trusting that server certificate (or its CA)."""

    def __init__(
        self,
        address: str,
        secret: str,
        round: int,  # noqa: A002
        cluster: int,
        spec: DecoderClientSpec | None = None,
        start_seq: int = 0,
        root_certificate: str = "",
    ) -> None:
        spec = spec if spec is not None else DecoderClientSpec()
        timeout_s, max_message_mb, shared_memory = spec.timeout_s, spec.max_message_mb, spec.shared_memory
        if not address:
            raise DataPlaneError(
                "no data-plane address given; the train message must carry the server's dataplane address"
            )
        if not timeout_s > 0:
            raise DataPlaneError(f"timeout_s={timeout_s} must be > 0; set dataplane.timeout_s")
        self.address = address
        self.round = int(round)
        self.cluster = int(cluster)
        self.compression = wire_mode(spec.compression)  # "none" | "fp16" | "int8"
        self.timeout_s = float(timeout_s)
        self.max_message_bytes = int(max_message_mb) * MB
        self._secret = secret
        self._seq = int(start_seq)  # step ids continue from here (a client reopened mid-round passes its last)
        self.transport = check_transport(spec.transport)
        # TLS when root_certificate is given: trust the server certificate (or its CA) the train message carried
        dialer = DIALERS[self.transport]
        self._dialer: Dialer = dialer(address, root_certificate, int(max_message_mb), self.timeout_s)
        self._stream: Connection | None = None
        self._lost = False  # the last dropped stream ended under its step (see the module docstring: one resend)
        # same-host shortcut (shm.py): frames through a shared-memory segment when the host is on a loopback
        # address and the channel is plaintext (dataplane.shared_memory: auto)
        try:
            shortcut = SharedMemory(shared_memory)
        except ValueError:
            raise DataPlaneError(
                f"dataplane.shared_memory={shared_memory!r} must be one of {', '.join(SharedMemory)}"
            ) from None
        self._use_shm = shortcut is SharedMemory.AUTO and is_loopback(address) and not root_certificate
        self._segment: ClientSegment | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.bytes_out = 0
        self.bytes_in = 0
        self.steps = 0
        self._open: tuple[int, list[dict[str, torch.Tensor]]] | None = None  # a 1F1B step: (seq, micro-batches)
        self._parts_done = 0
        self._last_loss = 0.0
        self._restart = False  # the next step starts a fresh attempt at the round (restart_attempt)

    def __call__(
        self, z_enc: list[torch.Tensor], micro_batches: list[dict[str, torch.Tensor]], lr_factor: float = 1.0
    ) -> tuple[float, list[torch.Tensor]]:
        """One step of the server's decoder on this CU's z_enc; returns (loss, dL/dz_enc per micro-batch).
        ``lr_factor`` is not sent: the decoder reads the same factor off the run's lr clock at this step's
        sequence number (``fl/server/server_state.decoder_lr_factor``)."""
        if len(z_enc) != len(micro_batches):
            raise DataPlaneError(
                f"{len(z_enc)} encoder outputs for {len(micro_batches)} micro-batches; send one z_enc per micro-batch"
            )
        with self._lock:
            self._check_open()
            self._seq += 1
            seq = self._seq
            frame = step_request_frame(
                self._secret, self.round, self.cluster, seq, z_enc, micro_batches, self.compression
            )
            reply = self._round_trip(self._marked(frame), seq, len(z_enc))
            self._restart = False
            self.steps += 1
            return reply.loss, reply.grads

    def restart_attempt(self) -> None:
        """The CU starts the round again (a re-plan after a lost device): its next step (or part 0) is marked
        ``restart``, so the server takes this round's earlier steps of the cluster out of its decoder first and
        numbers the next step 1 (``protocol.restarting``). Step ids keep rising."""
        with self._lock:
            self._restart, self._open = True, None

    def _marked(self, frame: Frame) -> Frame:
        return restarting(frame) if self._restart else frame

    # -- one micro-batch at a time (MicroHead, pipeline.schedule: 1f1b) -----------------------------------
    def begin_step(self, micro_batches: list[dict[str, torch.Tensor]], lr_factor: float = 1.0) -> None:
        """Open the next step (its id) of m = len(micro_batches) parts; ``lr_factor`` is not sent (as above)."""
        with self._lock:
            self._check_open()
            self._seq += 1
            self._open, self._parts_done = (self._seq, list(micro_batches)), 0

    def micro_step(self, i: int, z_enc: torch.Tensor) -> torch.Tensor:
        """Part i of the open step: z_enc of micro-batch i out, its dL/dz_enc back."""
        with self._lock:
            self._check_open()
            if self._open is None or i != self._parts_done:
                raise DataPlaneError(f"micro-batch {i} sent out of order (begin_step first, then parts 0..m-1)")
            seq, micro = self._open
            frame = part_request_frame(
                self._secret, self.round, self.cluster, seq, i, z_enc, micro, compression=self.compression
            )
            reply = self._round_trip(self._marked(frame) if i == 0 else frame, seq, 1, part=i)
            self._restart = False
            self._parts_done += 1
            self._last_loss = reply.loss
            return reply.grads[0]

    def end_step(self) -> float:
        """The step loss, once every part had its exchange (the reply to the last one carried it)."""
        with self._lock:
            if self._open is None or self._parts_done != len(self._open[1]):
                done = self._parts_done
                raise DataPlaneError(f"the step ended after {done} of its parts; send every micro-batch first")
            self._open = None
            self.steps += 1
            return self._last_loss

    def _check_open(self) -> None:
        if self._closed:
            raise DataPlaneError("this DecoderClient is closed; open a new one for the next round")

    def _round_trip(self, frame: Frame, seq: int, m: int, part: int | None = None) -> StepReply:
        """Send one request frame (inline or through shared memory) and decode its reply (under the lock)."""
        if len(frame) > self.max_message_bytes:
            raise DataPlaneError(
                f"step request of {len(frame) / MB:.1f} MiB exceeds "
                f"dataplane.max_message_mb={self.max_message_bytes // MB}; "
                f"raise it on server and CUs, use more micro-batches, or set dataplane.compression=fp16"
            )
        for resend in (False, True):
            reused = self._open_stream()
            try:
                item = self._send(frame)
                break
            except DataPlaneError:
                if resend or not reused or not self._lost:
                    raise
                log.info("data plane: the stream ended under step %s; resending it once on a fresh stream", seq)
        self.bytes_out += len(frame)
        self.bytes_in += len(item)
        try:
            return decode_reply(item, seq, m, part)
        except DataPlaneError:
            if _is_protocol_error(item):
                self._drop_stream()
            raise

    def _open_stream(self) -> bool:
        """Make sure a stream is open; True when it is one an earlier step used (False: opened now)."""
        if self._stream is not None and self._stream.ended():  # closed while idle: open a fresh one
            self._drop_stream()
        if self._stream is not None:
            return True
        self._stream = self._dialer.open(self.round, self.cluster, self._secret)
        return False

    def _send(self, frame: Frame) -> bytes | bytearray:
        """One request frame out (inline or through shared memory) and the host's answer (a reply or an error)."""
        sent = self._pointer_to(frame)
        item = self._exchange(sent if sent is not None else frame)
        if sent is not None:
            if _is_shm_refusal(item):  # the host cannot read this CU's segment: inline frames from now on
                self._stop_shm()
                item = self._exchange(frame)
            else:
                pointer = read_pointer(item)
                if pointer is not None and self._segment is not None:
                    item = self._segment.read(pointer[1])
        return item

    def _exchange(self, frame: Frame | bytes) -> bytes | bytearray:
        """Send one frame on the open stream and wait for the host's answer (bounded by timeout_s)."""
        stream = self._stream
        assert stream is not None, "the stream is opened before a frame is sent"
        try:
            return stream.exchange(frame)
        except DataPlaneError:
            self._lost = stream.lost
            self._drop_stream()
            raise

    def _pointer_to(self, frame: Frame) -> bytes | None:
        """``frame`` written to this client's segment, as the pointer frame to send; None = send it inline
        (shortcut off, or no segment can be made here, e.g. too little room in /dev/shm)."""
        if not self._use_shm:
            return None
        try:
            if self._segment is None or self._segment.size < len(frame):
                self._close_segment()
                size = 2 * len(frame)  # the reply (dL/dz_enc) is no larger than the request (z_enc + labels)
                if not shm_room_for(size):
                    raise OSError("not enough free space in /dev/shm")
                self._segment = ClientSegment(size)
            return self._segment.write(frame)
        except (OSError, DataPlaneError) as err:
            log.info("data plane: shared-memory shortcut off for this CU (%s); sending frames inline", err)
            self._stop_shm()
            return None

    def _stop_shm(self) -> None:
        self._use_shm = False
        self._close_segment()

    def _close_segment(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close(cancel=True)
            self._stream = None
        self._close_segment()

    def close(self) -> None:
        """End the stream (the server sees a clean end) and the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._stream is not None:
                self._stream.close(cancel=False)
                self._stream = None
            self._close_segment()
            self._dialer.close()

    def __enter__(self) -> DecoderClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_shm_refusal(frame: bytes | bytearray) -> bool:
    """The host's error frame saying it cannot open this CU's segment (then the step was not claimed)."""
    try:
        meta = decode_header(frame)
    except DataPlaneError:
        return False
    return meta.get("kind") == "error" and "shared-memory segment" in str(meta.get("message", ""))


def _is_protocol_error(frame: bytes | bytearray) -> bool:
    """True unless ``frame`` is a well-formed error frame (a refusal leaves the stream usable)."""
    try:
        return decode_header(frame).get("kind") != "error"
    except DataPlaneError:
        return True
