"""The decoder host's per-frame work (Algorithm 1, lines 13-15 on the server): one step request frame in,
one reply frame (loss and dL/dz_enc per micro-batch) or one error line out.

A frame is authenticated (the CU's own key for (t, n), on its own stream), its round / cluster checked,
decoded, its step id claimed and its tensors checked (:mod:`.checks`) before the decoder is touched. The head then
runs one whole :func:`~collapipe_flwr.pipeline.head.head_step` under the decoder's lock (per CU: in arrival
order, or in cluster order behind the turnstile of ``decoder_update: ordered``, :mod:`.ordered`), or joins the
barrier of step ``seq`` of every cluster (``decoder_update: joint``, :mod:`.joint`). A 1F1B part (micro-batch i of
step ``seq``, ``pipeline.schedule: 1f1b``) runs that micro-batch alone under the lock into the CU's open
:class:`~collapipe_flwr.pipeline.head_parts.HeadParts`; the last part takes the step's one decoder update.
The round is checked again under the lock, so a closed round runs no step after
:meth:`FrameService.close_round` returns. Every update is kept in the round's
:class:`~collapipe_flwr.fl.server.decoder.journal.RoundJournal`: a step marked ``restart`` (a CU's fresh attempt after
a re-plan) first takes that cluster's earlier steps of the round out of the decoder.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import torch

from collapipe_flwr.accelerator import module_device
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import key_matches
from collapipe_flwr.fl.dataplane.checks import (
    check_activation,
    check_micro_batch,
    check_part_fields,
    check_step,
    check_wire_dtype,
)
from collapipe_flwr.fl.dataplane.protocol import (
    StepRequest,
    decode_step_request,
    error_frame,
    peek_step_header,
    step_reply_frame,
)
from collapipe_flwr.fl.dataplane.stats import HostCounters, ServedSeconds
from collapipe_flwr.fl.dataplane.wire import Frame
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.fl.server.decoder.joint import StepResults
from collapipe_flwr.fl.server.decoder.journal import JOINT, PARTS, WHOLE, Applied, RoundJournal
from collapipe_flwr.fl.server.decoder.rounds import RoundGate, StepIds
from collapipe_flwr.fl.server.decoder.update_modes import DecoderUpdate, update_mode
from collapipe_flwr.models.split import TaskHead
from collapipe_flwr.pipeline.dropout_seed import HEAD, seed_block, step_seed
from collapipe_flwr.pipeline.head import head_step
from collapipe_flwr.pipeline.head_parts import HeadParts
from collapipe_flwr.pipeline.optim import scale_lr
from collapipe_flwr.precision import autocast

log = logging.getLogger(__name__)


class FrameService:
    """Serves step request frames on the task head / decoder (and its optimizer, or None).

    :attr:`lock` (its own) guards the head, the optimizer and the round state (:attr:`gate`); ``counters`` and
    :attr:`step_ids` share the host's state lock (``counters.state_lock``). Frames are checked against
    ``spec.hidden_size``, ``spec.max_len`` and ``spec.max_abs_activation`` in the wire ``spec.compression``;
    ``lr_factor_of(t, seq)`` is the factor of the decoder's base lr for step seq (1..) of round t (None: the base
    lr). ``spec.decoder_update`` joint gathers step seq of every cluster into one update; ordered applies the
    CUs' steps one by one in cluster order; per_cu one by one in arrival order.
    """

    def __init__(
        self,
        head: TaskHead,
        optimizer: torch.optim.Optimizer | None,
        secret: bytes,
        spec: DecoderHostSpec,
        *,
        counters: HostCounters,
        lr_factor_of: Callable[[int, int], float] | None = None,
    ) -> None:
        self.head = head
        self.optimizer = optimizer
        # runtime.seeded_dropout: the run's seed, from which each step's head masks are drawn (None: unseeded)
        self._dropout_seed = spec.dropout_seed
        self.precision = spec.precision  # the decoder's forward under bf16 autocast or not (runtime.precision)
        self._lr_factor_of = lr_factor_of  # (round t, step seq 1..) -> factor of the decoder's base lr
        self._base_lrs = [g["lr"] for g in optimizer.param_groups] if optimizer is not None else []
        self._secret = secret
        self.hidden_size = int(spec.hidden_size)
        self.max_len = int(spec.max_len)  # longest sequence a step may carry (the model's positions; 0 = no limit)
        self.max_abs_activation = float(spec.max_abs_activation)  # largest |z_enc| accepted (0 = no limit)
        self.compression = spec.compression  # "none" | "fp16" | "int8"
        self.lock = threading.Lock()  # guards the head, the optimizer and the round state
        self._lock_timeout_s = float(spec.lock_timeout_s)
        self._counters = counters
        self.gate = RoundGate()
        self.step_ids = StepIds(counters.state_lock)
        # (t, n) -> its open 1F1B step: (seq, its head parts, the part requests so far)
        self._parts: dict[tuple[int, int], tuple[int, HeadParts, list[StepRequest]]] = {}
        self.journal = RoundJournal()  # the round's snapshot and updates, for a CU's aborted attempt (journal.py)
        # federation.decoder_update (update_modes.py): per CU in arrival order, ordered (a turnstile) or joint (a
        # barrier: Algorithm 1 line 14, one update on all clusters' step), both waiting up to the lock timeout
        self.update: DecoderUpdate = update_mode(spec.decoder_update, self._run_joint, self._lock_timeout_s)

    # -- rounds ------------------------------------------------------------------------------------
    def open_round(self, round_: int, clusters: list[int]) -> None:
        """Accept steps of round t from ``clusters`` (the previous round is closed already)."""
        with self.lock:
            self.gate.open(round_, clusters)
            self._parts.clear()
            self.journal.open(self.head, self.optimizer, clusters)
        self.step_ids.keep_round(int(round_))
        self.update.open_round(round_, clusters)

    def close_round(self) -> int | None:
        """Refuse further steps of the open round; returns it (None if none was open) once no step runs."""
        self.update.close_round()
        with self.lock:
            self._parts.clear()  # a 1F1B step a CU left half done is never applied
            self.journal.close()
            return self.gate.close()

    def stream_ended(self, stream: tuple[int, int] | None) -> None:
        """The CU of (t, n) = ``stream`` ended its stream cleanly (its client closed: no more steps this round);
        under ``ordered`` the cluster leaves the order."""
        if stream is not None:
            self.update.leave(*stream)

    def not_admitted(self, round_: int, cluster: int) -> str | None:
        """Why a stream of cluster n in round t may not open, None when it may (read without the lock)."""
        try:
            self.gate.check(round_, cluster)
        except DataPlaneError as err:
            return str(err)
        return None

    # -- one frame ---------------------------------------------------------------------------------
    def serve(self, frame: bytes | bytearray, stream: tuple[int, int] | None = None) -> tuple[Frame, int | None]:
        """(reply or error frame, the step's round t or None when refused) for one request frame that
        arrived on the stream of (t, n) = ``stream`` (None: not known). A ``bytearray`` frame is the host's own
        copy (read out of a CU's segment): its tensors are decoded in place."""
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
            req = self._admit(frame, round_, cluster, seq, stream)
            return self._answer(req, frame, t0, round_, cluster, seq), round_
        except DataPlaneError as err:
            reply = error_frame(seq, str(err))
            self._counters.count(cluster, frame, reply, False, ServedSeconds(total=time.perf_counter() - t0))
            log.warning("data-plane request refused (round %s, cluster %s): %s", round_, cluster, err)
            return reply, None
        except Exception as err:  # a bug, not the CU's fault: answer it, keep serving, keep the trace in the log
            log.exception("data-plane request failed inside the decoder host")
            reply = error_frame(seq, f"internal error in the decoder host: {err.__class__.__name__}: {err}")
            self._counters.count(cluster, frame, reply, False, ServedSeconds(total=time.perf_counter() - t0))
            return reply, None

    def _admit(
        self, frame: bytes | bytearray, round_: int, cluster: int, seq: int, stream: tuple[int, int] | None
    ) -> StepRequest:
        """The decoded request of an authenticated frame, once its stream, round, step id and tensors pass."""
        if stream is not None and (round_, cluster) != stream:
            raise DataPlaneError(
                f"a step of round {round_}, cluster {cluster} on the stream of round {stream[0]}, cluster "
                f"{stream[1]}; a CU sends only its own steps"
            )
        self.gate.check(round_, cluster)
        req = decode_step_request(frame)
        if req.part is not None and self.update.whole_steps_only:
            raise DataPlaneError(
                "a 1F1B part (pipeline.schedule=1f1b) reached a decoder host that orders whole steps "
                f"(federation.decoder_update={self.update.name}); use decoder_update=per_cu or schedule=gpipe"
            )
        self.step_ids.claim(round_, cluster, seq, req.m if req.part is None else req.part)
        try:
            return self._check(req)
        except Exception:
            self.update.skip(round_, cluster, seq)  # the claimed step can never come again
            raise

    def _check(self, req: StepRequest) -> StepRequest:
        """The request, once its tensors pass (a whole step, or one 1F1B part)."""
        if req.part is None:
            check_step(req, self.hidden_size, self.compression, self.max_len, self.max_abs_activation)
            return req
        check_wire_dtype(req, self.compression)
        if req.part == 0:
            check_part_fields(req.micro_batches, self.max_len)
        mode = self.compression
        check_activation(req.part, req.z_enc[0], self.hidden_size, self.max_len, self.max_abs_activation, mode)
        return req

    def _answer(
        self, req: StepRequest, frame: bytes | bytearray, t0: float, round_: int, cluster: int, seq: int
    ) -> Frame:
        """Run the step as ``federation.decoder_update`` says (alone under the lock: at once, or at its turn in
        cluster order; or in a joint step) and encode loss and dL/dz_enc back."""
        t_wait = time.perf_counter()

        def alone(req: StepRequest) -> Frame:
            return self._answer_alone(req, frame, t0, t_wait, round_, cluster, seq)

        def joined(req: StepRequest, share: tuple[float, list[torch.Tensor]]) -> Frame:
            reply = step_reply_frame(seq, share[0], share[1], self.compression)
            wait = time.perf_counter() - t_wait
            self._counters.count(cluster, frame, reply, True, ServedSeconds(wait=wait, total=time.perf_counter() - t0))
            return reply

        return self.update.apply(req, alone, joined)

    def _answer_alone(
        self, req: StepRequest, frame: bytes | bytearray, t0: float, t_wait: float, round_: int, cluster: int, seq: int
    ) -> Frame:
        """One CU's step (or 1F1B part) alone under the decoder's lock; its reply frame."""
        if not self.lock.acquire(timeout=self._lock_timeout_s):
            raise DataPlaneError(
                f"the decoder stayed busy for {self._lock_timeout_s:g} s (other CUs' steps); retry, or give the "
                "server more time"
            )
        try:
            t_locked, cpu_start = time.perf_counter(), time.thread_time()
            self.gate.check(round_, cluster)
            if req.restart:
                self._restart(req)
            step = self.journal.step_of(round_, cluster, seq)
            self._seed_head(round_, cluster, step, req.part or 0)
            whole = True
            if req.part is None:
                loss, grads = self._run_head(req, step)
                self.journal.record(WHOLE, [req], step)
            else:
                loss, grads, whole = self._run_part(req, step)
            t_done, cpu = time.perf_counter(), time.thread_time() - cpu_start
            if whole:
                self._counters.served(round_, cluster, seq)
        finally:
            self.lock.release()
        reply = step_reply_frame(seq, loss, grads, self.compression, req.part)
        head, wait, total = t_done - t_locked, t_locked - t_wait, time.perf_counter() - t0
        self._counters.count(cluster, frame, reply, True, ServedSeconds(head, wait, total, cpu), whole=whole)
        return reply

    # -- the decoder step --------------------------------------------------------------------------
    def _seed_head(self, round_: int, cluster: int, step: int, part: int) -> None:
        """Under the lock, before a head step: its dropout masks from (seed, t, n, step, part) when the run seeds
        dropout (``pipeline/dropout_seed.py``), so they do not follow the order in which CUs' steps arrive;
        ``step`` is the step's number within the cluster's attempt (:meth:`RoundJournal.step_of`)."""
        if self._dropout_seed is not None:
            seed_block(step_seed(self._dropout_seed, round_, cluster, step), part, HEAD)

    def _scale_lr(self, round_: int, step: int) -> None:
        """The decoder's lr for step ``step`` of round t (the run's lr clock; the base lr without one)."""
        if self._lr_factor_of is not None and self.optimizer is not None:
            scale_lr(self.optimizer, self._base_lrs, self._lr_factor_of(round_, step))

    def _restart(self, req: StepRequest) -> None:
        """Under the lock: cluster n starts a fresh attempt at round t (journal.py): the decoder back as the round
        opened, the other clusters' updates of the round applied again in their order, n's open 1F1B step
        dropped."""
        self._parts.pop((req.round, req.cluster), None)
        kept = self.journal.restart(req.round, req.cluster, req.seq, self.head, self.optimizer)
        for entry in kept:
            self._replay(entry)
        log.info(
            "round %s: cluster %s restarted its round (a re-plan); its earlier steps taken out of the decoder, %s "
            "update(s) of other clusters applied again",
            req.round,
            req.cluster,
            len(kept),
        )

    def _replay(self, entry: Applied) -> None:
        """Apply one kept update again as it was first applied (same requests, lr factor and dropout masks)."""
        first = entry.requests[0]
        if entry.kind == JOINT:
            self._seed_head(first.round, -1, entry.step, 0)
            self._run_head(_joined(list(entry.requests)), entry.step)
        elif entry.kind == WHOLE:
            self._seed_head(first.round, first.cluster, entry.step, 0)
            self._run_head(first, entry.step)
        else:
            self.head.train()
            parts = HeadParts(self.head, first.micro_batches)
            for req in entry.requests:
                self._seed_head(first.round, first.cluster, entry.step, req.part or 0)
                with autocast(self.precision, module_device(self.head).type):
                    parts.part(req.part or 0, req.z_enc[0])
            self._scale_lr(first.round, entry.step)
            parts.apply(self.optimizer)
        self.journal.record(entry.kind, entry.requests, entry.step)

    def _run_joint(self, reqs: list[StepRequest]) -> StepResults:
        """One head step on all clusters' micro-batches of one step (under the lock); per cluster its own
        mean loss and dL/dz_enc rescaled from the joint mean (x C / C_n)."""
        if not self.lock.acquire(timeout=self._lock_timeout_s):
            raise DataPlaneError(
                f"the decoder stayed busy for {self._lock_timeout_s:g} s; retry, or give the server more time"
            )
        try:
            for req in reqs:
                self.gate.check(req.round, req.cluster)
            for req in reqs:
                if req.restart:
                    self._restart(req)
            step = self.journal.step_of(reqs[0].round, reqs[0].cluster, reqs[0].seq)
            self._seed_head(reqs[0].round, -1, step, 0)  # one joint step of every cluster: cluster -1
            terms: list[tuple[float, float, int]] = []  # per run of stacked micro-batches, never across clusters
            _, grads = self._run_head(_joined(reqs), step, terms, _cluster_starts(reqs))
            self.journal.record(JOINT, reqs, step)
            total = sum(c for _, c, _ in terms)
            out, i, runs = {}, 0, iter(terms)
            for req in reqs:
                m, taken, own = len(req.z_enc), 0, []
                while taken < m:
                    own.append(next(runs))
                    taken += own[-1][2]
                count = sum(c for _, c, _ in own)
                scale = total / count if count else 0.0
                out[int(req.cluster)] = (
                    sum(l for l, _, _ in own) / max(count, 1e-12),
                    [g * scale for g in grads[i : i + m]],
                )
                i += m
                self._counters.served(req.round, req.cluster, req.seq)
            return out
        finally:
            self.lock.release()

    def _run_part(self, req: StepRequest, step: int) -> tuple[float, list[torch.Tensor], bool]:
        """Micro-batch ``req.part`` of a 1F1B step under the lock: (its share l_i / C of the loss, or the step loss
        after the step's one update with the last part; [dL/dz_enc_i]; whether it was the last part). A failure
        drops the CU's open step: the decoder never takes a half step."""
        key, i = (req.round, req.cluster), int(req.part or 0)
        try:
            if i == 0:
                self.head.train()
                self._parts[key] = (req.seq, HeadParts(self.head, req.micro_batches), [])
            seq, parts, requests = self._parts.get(key, (None, None, []))
            if parts is None or seq != req.seq or parts.m != req.m:
                raise DataPlaneError(
                    f"part {i} of step {req.seq} arrived without the earlier parts of its step; a CU sends parts "
                    "0..m-1 of a step in order on one stream"
                )
            z = req.z_enc[0]
            check_micro_batch(i, z, parts.micro_batches[i], set(parts.micro_batches[0]), self.max_len)
            with autocast(self.precision, module_device(self.head).type):
                grad = parts.part(i, z)
            requests.append(req)
            if not parts.done:
                return parts.sums[-1] / float(parts.total), [grad], False
            del self._parts[key]
            self._scale_lr(req.round, step)
            loss = parts.apply(self.optimizer)
            self.journal.record(PARTS, requests, step)
            return loss, [grad], True
        except DataPlaneError:
            self._parts.pop(key, None)
            raise
        except Exception as err:  # e.g. a label out of range, no targets, a loss that is not finite
            self._parts.pop(key, None)
            raise DataPlaneError(f"the decoder could not run this part: {err.__class__.__name__}: {err}") from None

    def _run_head(
        self, req: StepRequest, step: int, terms: list | None = None, breaks: list[int] | None = None
    ) -> tuple[float, list[torch.Tensor]]:
        """head_step under the lock at step ``step``'s lr (``terms``, ``breaks``: a joint step's, per cluster); a
        head failure leaves weights and optimizer state untouched."""
        self.head.train()
        self._scale_lr(req.round, step)
        try:
            with autocast(self.precision, module_device(self.head).type):
                return head_step(self.head, self.optimizer, req.z_enc, req.micro_batches, terms, breaks or ())
        except DataPlaneError:
            raise
        except Exception as err:  # e.g. a label out of range, no targets; raised before optimizer.step()
            raise DataPlaneError(f"the decoder could not run this step: {err.__class__.__name__}: {err}") from None


def _cluster_starts(reqs: list[StepRequest]) -> list[int]:
    """The index in a joint step's micro-batches (:func:`_joined`) where each cluster's but the first begin."""
    starts, at = [], 0
    for req in reqs[:-1]:
        at += len(req.z_enc)
        starts.append(at)
    return starts


def _joined(reqs: list[StepRequest]) -> StepRequest:
    """One request holding every request's micro-batches in order (a joint step, ``decoder_update: joint``)."""
    z = [t for req in reqs for t in req.z_enc]
    mbs = [mb for req in reqs for mb in req.micro_batches]
    return dataclasses.replace(reqs[0], z_enc=z, micro_batches=mbs)
