"""The edge server's decoder host: serves the head to every CU of a round over gRPC (Algorithm 1,
lines 13-15: decoder forward and backward on the server, dL/dz_enc back to the CUs).

This module holds the gRPC lifecycle: the server, its port and TLS, the key interceptor, the stream
handler and the rounds it admits. A frame's work (checks, the decoder step, gradients back, counters)
is :class:`~collapipe_flwr.fl.dataplane.frame_service.FrameService`'s; the open streams and their idle
reaper are :class:`~collapipe_flwr.fl.dataplane.streams.StreamRegistry`'s.

Concurrency scheme (documented contract): several CUs of a round keep one bidirectional stream each,
and each stream is served by its own gRPC worker thread, which decodes and checks its requests in
parallel with the others. The head itself is touched only inside one ``threading.Lock``: every accepted
request runs a whole :func:`~collapipe_flwr.pipeline.head.head_step` (zero grads, forward and backward of
its m micro-batches, one optimizer step) while holding it. So the decoder's trajectory always equals
running the accepted steps one after another in the order they took the lock (recorded in
:attr:`DecoderHost.served_order`); steps never interleave and a refused request never changes the head
or its optimizer state. By default (``federation.decoder_update: per_cu``) each CU step is one decoder
update, applied in arrival order, so CUs never wait for each other; ``joint`` follows Algorithm 1, line 14
literally: one update per step on the activations of all N clusters (a barrier, see :mod:`.joint`);
``ordered`` keeps one update per CU step but applies step seq of the clusters in cluster order, then step
seq + 1 (a turnstile, see :mod:`.ordered`), so the trajectory does not depend on thread timing. A stream that
its CU ends cleanly (the client closed: its round's steps are over) takes its cluster out of that order.
Under ``pipeline.schedule: 1f1b`` a CU's step arrives as m part requests, one per micro-batch: each part runs
its micro-batch's head forward and backward under the lock, its head gradients summed apart from the head's
(``pipeline.head_parts.HeadParts``, one per (t, n)), and the last part takes the step's one update; parts of
different CUs may alternate, so a part sees the head as the updates before it left it.
The round / cluster membership is checked again under the lock, so :meth:`DecoderHost.close_round`
(which takes the same lock) is a clean cut: no step of a closed round runs after it returns.

Refusals (wrong secret, unknown or closed round, cluster not in the round, bad shape / dtype / values,
a head that fails on the request) are answered with an error frame, one line, on the same stream; the
stream stays usable. A frame over ``max_message_mb`` is refused by gRPC itself before any decoding
(RESOURCE_EXHAUSTED ends that stream; the client reports it and reopens on its next step). A CU that
vanishes mid-stream only ends its own handler; a step it left behind still completes under the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import torch

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import KeyInterceptor, identity_of
from collapipe_flwr.fl.dataplane.frame_service import FrameService
from collapipe_flwr.fl.dataplane.protocol import METHOD, SERVICE, encode_error, wire_mode
from collapipe_flwr.fl.dataplane.shm import HostSegments, read_pointer
from collapipe_flwr.fl.dataplane.stats import HostCounters
from collapipe_flwr.fl.dataplane.streams import MAX_STREAMS_PER_CLUSTER, StreamRegistry
from collapipe_flwr.fl.dataplane.transport import channel_options, format_address
from collapipe_flwr.models.split import TaskHead

__all__ = ["MAX_STREAMS_PER_CLUSTER", "DecoderHost"]

log = logging.getLogger(__name__)


class DecoderHost:
    """gRPC server of the task head / decoder for the CUs' per-step exchange.

    ``hidden_size`` is H, the encoder width every z_enc must have. ``advertise_host`` is the host part
    of :attr:`address` (default: ``bind``, or 127.0.0.1 when binding every interface). ``max_streams``
    bounds the concurrent CU streams (one worker thread each; more are refused). ``lock_timeout_s``
    bounds how long a request waits for the decoder behind other CUs' steps and, with ``joint`` / ``ordered``
    (Algorithm 1 line 14 as one update on all clusters / per CU in cluster order), how long a silent cluster is
    waited for before it is left out of the round's barrier / order. ``lr_factor_of(t, seq)`` is the factor of
    the decoder's base lr for step seq (1..) of round t (None: the base lr). A stream that sends no request
    for ``idle_timeout_s`` after its last reply (or after it opened) is cancelled by a reaper thread (the
    CU's client opens a fresh one on its next step), so streams held open by a stuck or hostile CU do not
    keep worker threads; keepalive pings end a stream whose CU's machine vanished,
    :meth:`close_round` cancels the round's streams, and :meth:`stop` cancels all.
    """

    def __init__(
        self,
        head: TaskHead,
        optimizer: torch.optim.Optimizer | None,
        secret: str,
        bind: str = "0.0.0.0",
        port: int = 0,
        fp16: bool = False,
        max_message_mb: int = 256,
        *,
        hidden_size: int,
        advertise_host: str | None = None,
        max_streams: int = 32,
        lock_timeout_s: float = 120.0,
        keep_order: int = 100_000,
        lr_factor_of: Callable[[int, int], float] | None = None,
        precision: str = "fp32",
        joint: bool = False,
        ordered: bool = False,
        max_len: int = 0,
        max_abs_activation: float = 0.0,
        tls: tuple[bytes, bytes] | None = None,
        idle_timeout_s: float = 30.0,
        compression: str = "",
    ) -> None:
        _check_settings(secret, port, max_message_mb, fp16, compression, idle_timeout_s)
        self.hidden_size = int(hidden_size)
        self.max_len = int(max_len)  # longest sequence a step may carry (the model's positions; 0 = no limit)
        self.max_abs_activation = float(max_abs_activation)  # largest |z_enc| accepted (0 = no limit)
        self.compression = wire_mode(fp16, compression)  # "none" | "fp16" | "int8" ("" = from fp16)
        self.fp16 = self.compression == "fp16"
        self.max_message_mb = int(max_message_mb)
        self._secret = secret.encode("utf-8")
        self._bind, self._port = bind, int(port)
        self._tls = tls  # (certificate PEM, private key PEM): serve over TLS; None: plaintext
        self._advertise = advertise_host or ("127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind)
        self._max_streams = int(max_streams)
        self._server: grpc.Server | None = None
        self._bound_port: int | None = None
        self._lock = threading.Lock()  # guards the head, the optimizer and the round state
        self._state_lock = threading.Lock()  # guards counters, step ids and the stream registry
        self._counters = HostCounters(self._state_lock, keep_order)
        self.max_streams_per_cluster = max(1, min(MAX_STREAMS_PER_CLUSTER, self._max_streams))
        self._streams = StreamRegistry(self._state_lock, self._counters, self.max_streams_per_cluster, idle_timeout_s)
        self._frames = FrameService(
            head,
            optimizer,
            self._secret,
            lock=self._lock,
            state_lock=self._state_lock,
            counters=self._counters,
            hidden_size=self.hidden_size,
            max_len=self.max_len,
            max_abs_activation=self.max_abs_activation,
            compression=self.compression,
            lock_timeout_s=float(lock_timeout_s),
            lr_factor_of=lr_factor_of,
            precision=precision,
            joint=joint,
            ordered=ordered,
        )

    @property
    def head(self) -> TaskHead:
        """The task head / decoder the data plane trains (use it outside only under :attr:`lock`)."""
        return self._frames.head

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The decoder's optimizer (its state is checkpointed with the run)."""
        return self._frames.optimizer

    @property
    def precision(self) -> str:
        """The decoder's forward under bf16 autocast or not (runtime.precision)."""
        return self._frames.precision

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> int:
        """Start serving; returns the bound port (a free one when ``port=0``)."""
        if self._server is not None:
            return self.port
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_streams + 2, thread_name_prefix="decoder-host"),
            options=channel_options(self.max_message_mb),
            maximum_concurrent_rpcs=self._max_streams,
            interceptors=(
                KeyInterceptor(
                    self._secret, on_refused=self._counters.refuse_unattributed, not_admitted=self._frames.not_admitted
                ),
            ),
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = self._add_port(server)
        server.start()
        self._server, self._bound_port = server, port
        self._streams.start_reaper()
        log.info("decoder data plane listening on %s", self.address)
        return port

    def _add_port(self, server: grpc.Server) -> int:
        """Bind ``server`` to bind:port, over TLS when given; the bound port (one-line error when taken)."""
        try:
            address = format_address(self._bind, self._port)
            if self._tls is None:
                port = server.add_insecure_port(address)
            else:
                cert, key = self._tls
                port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        except RuntimeError:
            port = 0
        if not port:
            raise DataPlaneError(
                f"cannot bind the data plane to {format_address(self._bind, self._port)}; choose a free "
                "dataplane.port or another dataplane.bind"
            )
        return port

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._bound_port is None:
            raise DataPlaneError("the decoder host is not started; call start() before reading its port")
        return self._bound_port

    @property
    def address(self) -> str:
        """host:port that CUs dial (announced to them in the train message)."""
        if self._bound_port is None:
            raise DataPlaneError("the decoder host is not started; call start() before reading its address")
        return format_address(self._advertise, self._bound_port)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; open streams are cancelled after ``grace_s`` seconds."""
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 5.0)
            self._server = None
        self._streams.stop_reaper()

    def __enter__(self) -> DecoderHost:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- rounds ------------------------------------------------------------------------------------
    def open_round(self, round: int, clusters: list[int]) -> None:  # noqa: A002 - the paper's t
        """Accept steps of round ``round`` from the CUs in ``clusters`` (closes any previous round)."""
        self.close_round()
        self._frames.open_round(round, clusters)

    def close_round(self) -> None:
        """Refuse further steps of the open round and cancel its streams; returns once no step runs."""
        closed = self._frames.close_round()
        if closed is not None:
            self._streams.cancel_round(closed)

    @property
    def lock(self) -> threading.Lock:
        """Hold this to use the head outside the data plane (e.g. evaluation between rounds)."""
        return self._lock

    # -- counters ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """{"clusters": {n: counters}, "unattributed": counters for frames without a valid header}."""
        return self._counters.stats()

    @property
    def served_order(self) -> list[tuple[int, int, int]]:
        """(round, cluster, seq) of every served step, in the order the head ran them."""
        return self._counters.served_order()

    @property
    def idle_cancelled(self) -> int:
        """Streams cancelled for idling (a counter for tests and logs)."""
        return self._streams.idle_cancelled

    @property
    def _last_seq(self) -> dict[tuple[int, int], tuple[int, int]]:
        """The highest step id (seq, part) claimed per (round, cluster) of the open round (the replay guard's
        state)."""
        return self._frames.step_ids.last

    # -- serving -----------------------------------------------------------------------------------
    def _serve_stream(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """One CU's bidirectional stream: each request frame (inline, or a pointer into the CU's shared
        memory) answered in order by :meth:`FrameService.serve`."""
        registered: int | None = None
        who = identity_of(context.invocation_metadata())  # (t, n, key), checked by KeyInterceptor
        stream = (who[0], who[1]) if who is not None else None
        if not self._streams.open(stream):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"cluster {stream[1] if stream else '?'} already has {self.max_streams_per_cluster} open data-plane "
                "streams; a CU needs one (close the others)",
            )
        self._streams.mark_idle(context)
        # the CU's shared-memory segments (same-host shortcut, shm.py), no frame larger than the task's cap
        segments = HostSegments(max_bytes=self.max_message_mb * 2**20)
        try:
            for raw in request_iterator:
                self._streams.mark_idle(context, busy=True)
                frame: bytes | bytearray = raw  # a bytearray: the host's own copy out of the CU's segment
                try:
                    pointer = read_pointer(frame)
                    if pointer is not None:
                        frame = segments.read(*pointer)
                except DataPlaneError as err:  # before the step is claimed: the CU may resend it inline
                    self._streams.mark_idle(context, refused=True)
                    yield encode_error(None, str(err))
                    continue
                answer, round_ = self._frames.serve(frame, stream)
                reply = segments.reply(pointer[0], answer) if pointer is not None else answer.tobytes()
                if registered is None and round_ is not None:
                    registered = round_
                    self._streams.register(round_, context)
                self._streams.mark_idle(context, refused=round_ is None)
                yield reply
            self._frames.stream_ended(stream)  # a clean end: the CU sends no more steps this round
        except Exception as err:  # the CU went away (cancel, disconnect, deadline) or the host stopped
            log.debug("data-plane stream ended: %s", err)
        finally:
            segments.close()
            self._streams.release(context, registered, stream)


def _check_settings(
    secret: str, port: int, max_message_mb: int, fp16: bool, compression: str, idle_timeout_s: float
) -> None:
    """One-line errors, in this order, for a host that could not serve: no secret, a port or a frame cap out of
    range, an unknown wire compression, an idle timeout that is not positive."""
    if not secret:
        raise DataPlaneError("the data-plane secret is empty; give DecoderHost a per-run random secret")
    if not 0 <= int(port) < 65536:
        raise DataPlaneError(f"data-plane port {port} is out of range; use 0..65535 (0 = any free port)")
    if int(max_message_mb) < 1:
        raise DataPlaneError(f"max_message_mb={max_message_mb} must be >= 1")
    wire_mode(fp16, compression)  # raises on an unknown compression
    if not idle_timeout_s > 0:
        raise DataPlaneError(f"idle_timeout_s={idle_timeout_s} must be > 0")
