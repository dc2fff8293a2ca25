"""The edge server's decoder host: serves the head to every CU of a round over gRPC (Algorithm 1,
lines 13-15: decoder forward and backward on the server, dL/dz_enc back to the CUs).

Concurrency scheme (documented contract): several CUs of a round keep one bidirectional stream each,
and each stream is served by its own gRPC worker thread, which decodes and checks its requests in
parallel with the others. The head itself is touched only inside one ``threading.Lock``: every accepted
request runs a whole :func:`~collapipe_flwr.pipeline.head.head_step` (zero grads, forward and backward of
its m micro-batches, one optimizer step) while holding it. So the decoder's trajectory always equals
running the accepted steps one after another in the order they took the lock (recorded in
:attr:`DecoderHost.served_order`); steps never interleave and a refused request never changes the head
or its optimizer state. By default (``federation.decoder_update: per_cu``) each CU step is one decoder
update, applied in arrival order, so CUs never wait for each other; ``joint`` follows Algorithm 1, line 14
literally: one update per step on the activations of all N clusters (a barrier, see :mod:`.joint`).
The round / cluster membership is checked again under the lock, so :meth:`DecoderHost.close_round`
(which takes the same lock) is a clean cut: no step of a closed round runs after it returns.

Refusals (wrong secret, unknown or closed round, cluster not in the round, bad shape / dtype / values,
a head that fails on the request) are answered with an error frame, one line, on the same stream; the
stream stays usable. A frame over ``max_message_mb`` is refused by gRPC itself before any decoding
(RESOURCE_EXHAUSTED ends that stream; the client reports it and reopens on its next step). A CU that
vanishes mid-stream only ends its own handler; a step it left behind still completes under the lock.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
import torch

from collapipe_flwr.accelerator import module_device
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import KeyInterceptor, identity_of, key_matches
from collapipe_flwr.fl.dataplane.checks import check_step
from collapipe_flwr.fl.dataplane.joint import JointSteps
from collapipe_flwr.fl.dataplane.protocol import (
    METHOD,
    SERVICE,
    decode_step_request,
    encode_error,
    encode_step_reply,
    peek_step_header,
    wire_mode,
)
from collapipe_flwr.fl.dataplane.shm import HostSegments, read_pointer
from collapipe_flwr.fl.dataplane.stats import ClusterCounters
from collapipe_flwr.fl.dataplane.transport import channel_options, format_address
from collapipe_flwr.models.split import TaskHead
from collapipe_flwr.pipeline.head import head_step
from collapipe_flwr.pipeline.optim import scale_lr
from collapipe_flwr.precision import autocast

log = logging.getLogger(__name__)

MAX_STREAMS_PER_CLUSTER = 4  # open data-plane streams one (round, cluster) key may hold at once


class DecoderHost:
    """gRPC server of the task head / decoder for the CUs' per-step exchange.

    ``hidden_size`` is H, the encoder width every z_enc must have. ``advertise_host`` is the host part
    of :attr:`address` (default: ``bind``, or 127.0.0.1 when binding every interface). ``max_streams``
    bounds the concurrent CU streams (one worker thread each; more are refused). ``lock_timeout_s``
    bounds how long a request waits for the decoder behind other CUs' steps. A stream that sends no request
    for ``idle_timeout_s`` after its last reply (or after it opened) is cancelled by a reaper thread (the
    CU's client opens a fresh one on its next step), so streams held open by a stuck or hostile CU do not
    keep worker threads; keepalive pings end a stream whose CU's machine vanished, :meth:`close_round`
    cancels the round's streams, and :meth:`stop` cancels all.
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
        lr_schedule: Callable[[int, int], float] | None = None,
        precision: str = "fp32",
        joint: bool = False,
        max_len: int = 0,
        max_abs_activation: float = 0.0,
        tls: tuple[bytes, bytes] | None = None,
        idle_timeout_s: float = 30.0,
        compression: str = "",
    ) -> None:
        if not secret:
            raise DataPlaneError("the data-plane secret is empty; give DecoderHost a per-run random secret")
        if not 0 <= int(port) < 65536:
            raise DataPlaneError(f"data-plane port {port} is out of range; use 0..65535 (0 = any free port)")
        if int(max_message_mb) < 1:
            raise DataPlaneError(f"max_message_mb={max_message_mb} must be >= 1")
        self.head = head
        self.optimizer = optimizer
        self.precision = precision  # the decoder's forward under bf16 autocast or not (runtime.precision)
        self._lr_schedule = lr_schedule  # (round t, step seq 1..) -> factor of the decoder's base lr
        self._base_lrs = [g["lr"] for g in optimizer.param_groups] if optimizer is not None else []
        self.hidden_size = int(hidden_size)
        self.max_len = int(max_len)  # longest sequence a step may carry (the model's positions; 0 = no limit)
        self.max_abs_activation = float(max_abs_activation)  # largest |z_enc| accepted (0 = no limit)
        self.compression = wire_mode(fp16, compression)  # "none" | "fp16" | "int8" ("" = from fp16)
        self.fp16 = self.compression == "fp16"
        self.max_message_mb = int(max_message_mb)
        self._secret = secret.encode("utf-8")
        self._bind = bind
        self._tls = tls  # (certificate PEM, private key PEM): serve over TLS; None: plaintext
        self._port = int(port)
        self._advertise = advertise_host or ("127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind)
        self._max_streams = int(max_streams)
        self._lock_timeout_s = float(lock_timeout_s)
        self._lock = threading.Lock()  # guards the head, the optimizer and the round state
        self._state_lock = threading.Lock()  # guards counters and the stream registry
        self._round: int | None = None
        self._clusters: frozenset[int] = frozenset()
        self._closed_rounds: set[int] = set()
        self._streams: dict[int, set] = collections.defaultdict(set)
        self._counters: dict[int, ClusterCounters] = collections.defaultdict(ClusterCounters)
        self._unattributed = ClusterCounters()
        self._order: collections.deque = collections.deque(maxlen=keep_order)
        self._server: grpc.Server | None = None
        self._bound_port: int | None = None
        # decoder_update: joint (Algorithm 1 line 14, one update on all clusters' step) instead of per CU
        self._joint = JointSteps(self._run_joint, timeout_s=lock_timeout_s) if joint else None
        self._last_seq: dict[tuple[int, int], int] = {}  # highest step id claimed per (round, cluster)
        if not idle_timeout_s > 0:
            raise DataPlaneError(f"idle_timeout_s={idle_timeout_s} must be > 0")
        self._idle_timeout_s = float(idle_timeout_s)
        self._idle_since: dict[
            grpc.ServicerContext, float
        ] = {}  # open stream's context -> when it last went idle (inf: busy)
        self._last_accepted: dict[grpc.ServicerContext, float] = {}  # when the stream last had a step accepted
        # each (t, n) may hold this many streams at once (a CU needs one; a reopened one may overlap the old)
        self.max_streams_per_cluster = max(1, min(MAX_STREAMS_PER_CLUSTER, self._max_streams))
        self._open_per_cluster: collections.Counter = collections.Counter()
        self._reaper_stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self.idle_cancelled = 0  # streams cancelled for idling (a counter for tests and logs)

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
                KeyInterceptor(self._secret, on_refused=self._count_unauthenticated, not_admitted=self._not_admitted),
            ),
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)}
        )
        server.add_generic_rpc_handlers((handler,))
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
        server.start()
        self._server, self._bound_port = server, port
        self._reaper_stop.clear()
        self._reaper = threading.Thread(target=self._reap_idle_streams, name="decoder-host-reaper", daemon=True)
        self._reaper.start()
        log.info("decoder data plane listening on %s", self.address)
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
        self._reaper_stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5.0)
            self._reaper = None

    def __enter__(self) -> DecoderHost:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- rounds ------------------------------------------------------------------------------------
    def open_round(self, round: int, clusters: list[int]) -> None:  # noqa: A002 - the paper's t
        """Accept steps of round ``round`` from the CUs in ``clusters`` (closes any previous round)."""
        self.close_round()
        with self._lock:
            self._round = int(round)
            self._clusters = frozenset(int(c) for c in clusters)
            self._closed_rounds.discard(self._round)
        with self._state_lock:  # only the open round's step ids can be claimed: keep O(N), not O(N * T)
            self._last_seq = {key: seq for key, seq in self._last_seq.items() if key[0] == self._round}
        if self._joint is not None:
            self._joint.open_round(round, clusters)

    def close_round(self) -> None:
        """Refuse further steps of the open round and cancel its streams; returns once no step runs."""
        if self._joint is not None:
            self._joint.close_round()
        with self._lock:
            if self._round is None:
                return
            closed, self._round, self._clusters = self._round, None, frozenset()
            self._closed_rounds.add(closed)
        with self._state_lock:
            contexts = list(self._streams.pop(closed, ()))
        for context in contexts:
            context.cancel()

    @property
    def lock(self) -> threading.Lock:
        """Hold this to use the head outside the data plane (e.g. evaluation between rounds)."""
        return self._lock

    def _not_admitted(self, round_: int, cluster: int) -> str | None:
        """Why a stream of cluster n in round t may not open (t is not the open round, or it did not select n),
        None when it may. Read without the lock: a stale answer is caught again per frame by _check_round."""
        try:
            self._check_round(round_, cluster)
        except DataPlaneError as err:
            return str(err)
        return None

    # -- counters ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """{"clusters": {n: counters}, "unattributed": counters for frames without a valid header}."""
        with self._state_lock:
            return {
                "clusters": {n: c.to_dict() for n, c in sorted(self._counters.items())},
                "unattributed": self._unattributed.to_dict(),
            }

    @property
    def served_order(self) -> list[tuple[int, int, int]]:
        """(round, cluster, seq) of every served step, in the order the head ran them."""
        with self._state_lock:
            return list(self._order)

    # -- serving -----------------------------------------------------------------------------------
    def _serve_stream(self, request_iterator, context):
        registered: int | None = None
        who = identity_of(context.invocation_metadata())  # (t, n, key), checked by KeyInterceptor
        stream = (who[0], who[1]) if who is not None else None
        if not self._open_stream(stream):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"cluster {stream[1] if stream else '?'} already has {self.max_streams_per_cluster} open data-plane "
                "streams; a CU needs one (close the others)",
            )
        self._mark_idle(context)
        # the CU's shared-memory segments (same-host shortcut, shm.py), no frame larger than the task's cap
        segments = HostSegments(max_bytes=self.max_message_mb * 2**20)
        try:
            for frame in request_iterator:
                self._mark_idle(context, busy=True)
                try:
                    pointer = read_pointer(frame)
                    if pointer is not None:
                        frame = segments.read(*pointer)
                except DataPlaneError as err:  # before the step is claimed: the CU may resend it inline
                    self._mark_idle(context, refused=True)
                    yield encode_error(None, str(err))
                    continue
                reply, round_ = self._serve_frame(frame, stream)
                if pointer is not None:
                    reply = segments.reply(pointer[0], reply)
                if registered is None and round_ is not None:
                    registered = round_
                    with self._state_lock:
                        self._streams[round_].add(context)
                self._mark_idle(context, refused=round_ is None)
                yield reply
        except Exception as err:  # the CU went away (cancel, disconnect, deadline) or the host stopped
            log.debug("data-plane stream ended: %s", err)
        finally:
            segments.close()
            with self._state_lock:
                self._idle_since.pop(context, None)
                self._last_accepted.pop(context, None)
                if registered is not None:
                    self._streams.get(registered, set()).discard(context)
                if stream is not None:
                    self._open_per_cluster[stream] -= 1
                    if self._open_per_cluster[stream] <= 0:
                        del self._open_per_cluster[stream]

    def _open_stream(self, stream: tuple[int, int] | None) -> bool:
        """Count a new stream of (t, n); False when that cluster already holds its share of the host's streams
        (one key holder must not fill ``max_streams`` and lock every other CU out)."""
        if stream is None:
            return True
        with self._state_lock:
            if self._open_per_cluster[stream] >= self.max_streams_per_cluster:
                self._unattributed.refused += 1
                return False
            self._open_per_cluster[stream] += 1
            return True

    def _mark_idle(self, context, busy: bool = False, refused: bool = False) -> None:
        """Idle since now, or busy (inf). Only an accepted step (or the stream's opening) starts the idle clock
        afresh: after a refused frame the stream is idle since its last accepted step, so a CU sending junk
        every few seconds is still reaped after ``idle_timeout_s``."""
        with self._state_lock:
            now = time.monotonic()
            if busy:
                self._last_accepted.setdefault(context, self._idle_since.get(context, now))
                self._idle_since[context] = math.inf
            elif refused:
                self._idle_since[context] = self._last_accepted.get(context, now)
            else:
                self._idle_since[context] = now
                self._last_accepted[context] = now

    def _reap_idle_streams(self) -> None:
        """Cancel every stream idle for longer than ``idle_timeout_s`` (runs until :meth:`stop`)."""
        period = min(1.0, self._idle_timeout_s / 4)
        while not self._reaper_stop.wait(period):
            now = time.monotonic()
            with self._state_lock:
                stale = [c for c, since in self._idle_since.items() if now - since > self._idle_timeout_s]
                for context in stale:
                    self._idle_since.pop(context, None)
            for context in stale:
                self.idle_cancelled += 1
                context.cancel()

    def _serve_frame(self, frame: bytes, stream: tuple[int, int] | None = None) -> tuple[bytes, int | None]:
        t0 = time.perf_counter()
        seq = cluster = round_ = None
        try:
            secret, round_, cluster, seq, _m = peek_step_header(frame)
            if not key_matches(self._secret, round_, cluster, secret):
                cluster = round_ = None
                raise DataPlaneError(
                    "wrong data-plane key for this round and cluster; the CU must use the key from its own train "
                    "message"
                )
            if stream is not None and (round_, cluster) != stream:
                raise DataPlaneError(
                    f"a step of round {round_}, cluster {cluster} on the stream of round {stream[0]}, cluster "
                    f"{stream[1]}; a CU sends only its own steps"
                )
            self._check_round(round_, cluster)
            self._claim_seq(round_, cluster, seq)
            req = decode_step_request(frame)
            check_step(req, self.hidden_size, False, self.max_len, self.max_abs_activation, self.compression)
            t_wait = time.perf_counter()
            joint = self._joint.submit(req) if self._joint is not None else None
            if joint is not None:
                loss, grads = joint
                reply = encode_step_reply(seq, loss, grads, compression=self.compression)
                self._count(
                    cluster,
                    frame,
                    reply,
                    served=True,
                    wait=time.perf_counter() - t_wait,
                    total=time.perf_counter() - t0,
                )
                return reply, round_
            if not self._lock.acquire(timeout=self._lock_timeout_s):
                raise DataPlaneError(
                    f"the decoder stayed busy for {self._lock_timeout_s:g} s (other CUs' steps); retry, or give the "
                    "server more time"
                )
            try:
                t_locked = time.perf_counter()
                self._check_round(round_, cluster)
                loss, grads = self._run_head(req)
                t_done = time.perf_counter()
                with self._state_lock:
                    self._order.append((round_, cluster, seq))
            finally:
                self._lock.release()
            reply = encode_step_reply(seq, loss, grads, compression=self.compression)
            self._count(
                cluster,
                frame,
                reply,
                served=True,
                head=t_done - t_locked,
                wait=t_locked - t_wait,
                total=time.perf_counter() - t0,
            )
            return reply, round_
        except DataPlaneError as err:
            reply = encode_error(seq, str(err))
            self._count(cluster, frame, reply, served=False, total=time.perf_counter() - t0)
            log.warning("data-plane request refused (round %s, cluster %s): %s", round_, cluster, err)
            return reply, None
        except Exception as err:  # a bug, not the CU's fault: answer it, keep serving, keep the trace in the log
            log.exception("data-plane request failed inside the decoder host")
            reply = encode_error(seq, f"internal error in the decoder host: {err.__class__.__name__}: {err}")
            self._count(cluster, frame, reply, served=False, total=time.perf_counter() - t0)
            return reply, None

    def _claim_seq(self, round_: int, cluster: int, seq: int) -> None:
        """Step ids increase strictly per (round, cluster): a replayed or reordered frame is refused."""
        with self._state_lock:
            last = self._last_seq.get((round_, cluster), 0)
            if seq <= last:
                raise DataPlaneError(
                    f"step id {seq} of cluster {cluster} in round {round_} is not above the last one ({last}): a "
                    "replayed or reordered frame; a CU numbers its steps 1, 2, ... within a round"
                )
            self._last_seq[(round_, cluster)] = seq

    def _count_unauthenticated(self) -> None:
        with self._state_lock:
            self._unattributed.refused += 1

    def _check_round(self, round_: int, cluster: int) -> None:
        if self._round != round_:
            state = "is closed" if round_ in self._closed_rounds else "is not open"
            now = f"round {self._round} is open" if self._round is not None else "no round is open"
            raise DataPlaneError(
                f"round {round_} {state} on the decoder host ({now}); the CU must use the current round's train message"
            )
        if cluster not in self._clusters:
            raise DataPlaneError(
                f"cluster {cluster} is not selected in round {round_} (selected: {sorted(self._clusters)}); only the "
                "round's chosen CUs may send steps"
            )

    def _run_joint(self, reqs) -> dict[int, tuple[float, list[torch.Tensor]]]:
        """One head step on all clusters' micro-batches of one step (under the lock); per cluster its own
        mean loss and dL/dz_enc rescaled from the joint mean (x C / C_n)."""
        if not self._lock.acquire(timeout=self._lock_timeout_s):
            raise DataPlaneError(
                f"the decoder stayed busy for {self._lock_timeout_s:g} s; retry, or give the server more time"
            )
        try:
            for req in reqs:
                self._check_round(req.round, req.cluster)
            z = [t for req in reqs for t in req.z_enc]
            mbs = [mb for req in reqs for mb in req.micro_batches]
            joint_req = dataclasses.replace(reqs[0], z_enc=z, micro_batches=mbs)
            terms: list[tuple[float, float]] = []
            _, grads = self._run_head(joint_req, terms)
            total = sum(c for _, c in terms)
            out, i = {}, 0
            for req in reqs:
                m = len(req.z_enc)
                own = terms[i : i + m]
                count = sum(c for _, c in own)
                scale = total / count if count else 0.0
                out[int(req.cluster)] = (
                    sum(l for l, _ in own) / max(count, 1e-12),
                    [g * scale for g in grads[i : i + m]],
                )
                i += m
                with self._state_lock:
                    self._order.append((req.round, req.cluster, req.seq))
            return out
        finally:
            self._lock.release()

    def _run_head(self, req, terms: list | None = None):
        """head_step under the lock; a head failure leaves weights and optimizer state untouched."""
        self.head.train()
        if self._lr_schedule is not None and self.optimizer is not None:
            scale_lr(self.optimizer, self._base_lrs, self._lr_schedule(req.round, req.seq))
        try:
            with autocast(self.precision, module_device(self.head).type):
                return head_step(self.head, self.optimizer, req.z_enc, req.micro_batches, terms)
        except DataPlaneError:
            raise
        except Exception as err:  # e.g. a label out of range, no targets; raised before optimizer.step()
            raise DataPlaneError(f"the decoder could not run this step: {err.__class__.__name__}: {err}") from None

    def _count(self, cluster, frame, reply, served, head=0.0, wait=0.0, total=0.0) -> None:
        with self._state_lock:
            c = self._counters[cluster] if cluster is not None else self._unattributed
            c.steps += int(served)
            c.refused += int(not served)
            c.bytes_in += len(frame)
            c.bytes_out += len(reply)
            c.seconds_head += head
            c.seconds_wait += wait
            c.seconds_total += total
