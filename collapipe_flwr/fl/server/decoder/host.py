"""The edge server's decoder host: serves the head to every CU of a round (Algorithm 1, lines 13-15: decoder
forward and backward on the server, dL/dz_enc back to the CUs).

This module holds the host's lifecycle and the rounds it admits; the transport that carries the CUs' streams
(``transport``: ``grpc``, :mod:`.grpc_server`, or ``socket``, :mod:`.socket_server`) is picked here and reached
only through :class:`~.backend.Listener`. Who may open a stream and each stream's frames are
:class:`~.stream_session.Sessions`'; a frame's work (checks, the decoder step, gradients back, counters)
is :class:`~collapipe_flwr.fl.server.decoder.frame_service.FrameService`'s; the open streams and their idle
reaper are :class:`~collapipe_flwr.fl.dataplane.streams.StreamRegistry`'s.

Concurrency scheme (documented contract): several CUs of a round keep one stream each (a gRPC bidirectional
stream or a TCP connection), and each stream is served by its own worker thread, which decodes and checks its
requests in parallel with the others. The head itself is touched only inside one ``threading.Lock``: every accepted
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
stream stays usable. A frame over ``max_message_mb`` is refused before any decoding, by gRPC itself or by the
socket transport from the frame's length prefix (either ends that stream; the client reports it and reopens on
its next step). A CU that
vanishes mid-stream only ends its own handler; a step it left behind still completes under the lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

from collapipe_flwr.config.sections import Transport
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane import shm
from collapipe_flwr.fl.dataplane.backend import Listener
from collapipe_flwr.fl.dataplane.grpc_server import GrpcListener
from collapipe_flwr.fl.dataplane.socket_server import SocketListener
from collapipe_flwr.fl.dataplane.stats import HostCounters
from collapipe_flwr.fl.dataplane.stream_session import Sessions
from collapipe_flwr.fl.dataplane.streams import MAX_STREAMS_PER_CLUSTER, StreamRegistry
from collapipe_flwr.fl.dataplane.transport import format_address
from collapipe_flwr.fl.server.decoder.frame_service import FrameService
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.models.split import TaskHead

__all__ = ["MAX_STREAMS_PER_CLUSTER", "DecoderHost", "DecoderHostSpec"]

log = logging.getLogger(__name__)


class DecoderHost:
    """Server of the task head / decoder for the CUs' per-step exchange, over ``spec.transport`` (grpc | socket).

    ``spec`` holds the host's settings (:class:`~.host_spec.DecoderHostSpec`): H, the bound and advertised
    address, the wire compression, the frame cap, ``max_streams`` (concurrent CU streams, one worker thread each;
    more are refused), ``lock_timeout_s`` (how long a request waits for the decoder behind other CUs' steps and,
    with ``decoder_update`` joint / ordered, Algorithm 1 line 14 as one update on all clusters / per CU in
    cluster order, how long a silent cluster is waited for before it is left out of the round's barrier /
    order). ``lr_factor_of(t, seq)`` is the factor of the decoder's base lr for step seq (1..) of round t
    (None: the base lr). A stream that sends no request for ``spec.idle_timeout_s`` after its last reply (or
    after it opened) is cancelled by a reaper thread (the CU's client opens a fresh one on its next step), so
    streams held open by a stuck or hostile CU do not keep worker threads; keepalive pings end a stream whose
    CU's machine vanished, :meth:`close_round` cancels the round's streams, and :meth:`stop` cancels all.
    ``spec.dropout_seed`` (the run's seed under ``runtime.seeded_dropout``) draws each head step's dropout masks
    from (seed, t, n, seq), not from the order the steps arrive in (``pipeline/dropout_seed.py``). ``tls`` is
    (certificate PEM, private key PEM): serve over TLS; None: plaintext.
    """

    def __init__(
        self,
        head: TaskHead,
        optimizer: torch.optim.Optimizer | None,
        secret: str,
        spec: DecoderHostSpec,
        *,
        lr_factor_of: Callable[[int, int], float] | None = None,
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        if not secret:
            raise DataPlaneError("the data-plane secret is empty; give DecoderHost a per-run random secret")
        self.spec = spec
        self.transport = spec.transport
        self.hidden_size = int(spec.hidden_size)
        self.max_len = int(spec.max_len)  # longest sequence a step may carry (the model's positions; 0 = no limit)
        self.max_abs_activation = float(spec.max_abs_activation)  # largest |z_enc| accepted (0 = no limit)
        self.compression = spec.compression  # "none" | "fp16" | "int8"
        self.max_message_mb = int(spec.max_message_mb)
        self._secret = secret.encode("utf-8")
        self._bind, self._port = spec.bind, int(spec.port)
        self._tls = tls  # (certificate PEM, private key PEM): serve over TLS; None: plaintext
        wildcard = spec.bind in ("0.0.0.0", "::", "")
        self._advertise = spec.advertise_host or ("127.0.0.1" if wildcard else spec.bind)
        self._max_streams = int(spec.max_streams)
        self._listener: Listener | None = None
        self._bound_port: int | None = None
        state_lock = threading.Lock()  # guards counters, step ids and the stream registry
        self._counters = HostCounters(state_lock, spec.keep_order)
        self.max_streams_per_cluster = max(1, min(MAX_STREAMS_PER_CLUSTER, self._max_streams))
        self._streams = StreamRegistry(state_lock, self._counters, self.max_streams_per_cluster, spec.idle_timeout_s)
        # the frame service owns the decoder's lock: it guards the head, the optimizer and the round state
        self._frames = FrameService(
            head, optimizer, self._secret, spec, counters=self._counters, lr_factor_of=lr_factor_of
        )
        self._sessions = Sessions(self._secret, self._frames, self._streams, self._counters, self.max_message_mb)

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
        """Start serving; returns the bound port (a free one when ``port=0``). First removes the shared-memory
        segments that CUs of earlier runs on this host left when they were killed (:func:`.shm.remove_stale`)."""
        if self._listener is not None:
            return self.port
        stale = shm.remove_stale()
        if stale:
            log.info("data plane: removed %d shared-memory segments of CUs that are gone", len(stale))
        listener: Listener
        if self.transport is Transport.SOCKET:
            listener = SocketListener(
                self._sessions, bind=self._bind, port=self._port, tls=self._tls, max_streams=self._max_streams
            )
        else:
            listener = GrpcListener(
                self._sessions, bind=self._bind, port=self._port, tls=self._tls, max_streams=self._max_streams
            )
        port = listener.start()
        self._listener, self._bound_port = listener, port
        self._streams.start_reaper()
        log.info("decoder data plane listening on %s (%s)", self.address, self.transport)
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
        if self._listener is not None:
            self._listener.stop(grace_s)
            self._listener = None
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
        return self._frames.lock

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
