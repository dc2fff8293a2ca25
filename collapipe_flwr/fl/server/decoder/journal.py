"""What the server's decoder took in the open round, so that a CU's aborted attempt can be taken out again.

A CU that loses a device mid-round re-plans Sub-1 over the devices left and trains the round again from the
round's global weights (``fl/cu/device_loss.py``). The decoder, which all of the round's CUs share, had already
taken the aborted attempt's steps, and (per CU, in arrival order) other CUs' steps after them. Left there, those
steps are a trace: the re-planned cluster's round trains its encoder against a decoder that saw part of its data
twice (the paper-setting testbed records showed it as a round-2 loss of 6.8-7.4 against 8.2-9.0 in the runs that
lost devices in round 2).

:class:`RoundJournal` keeps the decoder's weights and optimizer state as the round opened, and every update the
decoder applied since: its requests, and the step number (1, 2, ... within the cluster's attempt) its learning-rate
factor and dropout masks were drawn for. When cluster n starts a fresh attempt (its first step carries
``restart``, ``fl/dataplane/protocol.restarting``), :meth:`RoundJournal.restart` puts the snapshot back and hands
the other clusters' updates back in their order, for the host to apply again, and numbers n's steps from 1 again.
The decoder is then what it would be had the aborted attempt never reached it; the other CUs' gradients already
returned are not taken back (they trained against the decoder as it was), which no server-side rule can undo.

Why by hand: neither Flower nor PyTorch keeps an undo log of optimizer steps; this is a snapshot (``state_dict``
copies) and a list.

What it keeps of the requests: nothing when the round admits one cluster (a restart then has no other cluster's
update to apply again), else a copy of each request's tensors in buffers the journal owns and reuses round after
round (:class:`TensorPool`). Keeping the decoded requests themselves would pin the buffer each frame was received
into, so every step would need fresh pages: measured on the data-plane benchmark (one 64 x 32 x 256 fp32 step),
555-900 page faults per step and 1.64 against 0.79 ms of the host's CPU per head step. A pooled copy costs one
memcpy into pages already mapped. Memory: the round's other-cluster steps, at most ``local_steps`` x N x (|z_enc| +
the micro-batches), held from the first round on; and one copy of the decoder and its optimizer state, refreshed in
place as each round opens.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

import torch

from collapipe_flwr.fl.dataplane.protocol import StepRequest

WHOLE, PARTS, JOINT = "whole", "parts", "joint"  # a step in one request, a 1F1B step in m parts, a joint step


@dataclass(frozen=True)
class Applied:
    """One decoder update of the open round: ``kind`` (:data:`WHOLE`, :data:`PARTS`: the step's m part requests in
    order, :data:`JOINT`: one request per cluster), its ``requests`` and the ``step`` number its lr factor and
    dropout masks were drawn for."""

    kind: str
    requests: tuple[StepRequest, ...]
    step: int

    def without(self, cluster: int) -> Applied | None:
        """This update with cluster n's requests taken out (None when nothing is left)."""
        kept = tuple(r for r in self.requests if r.cluster != cluster)
        if not kept:
            return None
        return Applied(self.kind, kept, self.step) if len(kept) != len(self.requests) else self


class TensorPool:
    """Tensors the journal copies requests into, reused from round to round: :meth:`copy` takes a free buffer of
    the same size (or allocates one), :meth:`recycle` frees every buffer handed out since the last call (a round's
    requests are let go together, when the next round opens).

    A copy sits at the same address modulo 64 bytes as its original (a buffer has 64 bytes to spare): CPU kernels
    split a reduction by the data's alignment, so a copy aligned differently gives the replayed step sums in another
    order, and a decoder that differs from the uninterrupted one in the last bits (measured: 2.8e-9 in a weight)."""

    _SLACK = 64

    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = {}  # bytes -> free uint8 buffers of bytes + _SLACK
        self._lent: list[torch.Tensor] = []

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A pooled copy of ``t`` (same values, shape and dtype, same address modulo 64; its own storage)."""
        t = t.detach()
        nbytes = t.numel() * t.element_size()
        free = self._free.get(nbytes)
        buffer = free.pop() if free else torch.empty(nbytes + self._SLACK, dtype=torch.uint8, device=t.device)
        self._lent.append(buffer)
        shift = (t.data_ptr() - buffer.data_ptr()) % self._SLACK
        out = buffer[shift : shift + nbytes].view(t.dtype).view(t.shape)
        out.copy_(t)
        return out

    def recycle(self) -> None:
        """Every buffer handed out since the last call is free again."""
        for buffer in self._lent:
            self._free.setdefault(buffer.numel() - self._SLACK, []).append(buffer)
        self._lent = []

    def request(self, req: StepRequest) -> StepRequest:
        """``req`` with its activations and micro-batch tensors replaced by pooled copies."""
        z = [self.copy(t) for t in req.z_enc]
        batches = [{k: self.copy(v) for k, v in mb.items()} for mb in req.micro_batches]
        return dataclasses.replace(req, z_enc=z, micro_batches=batches)


@dataclass(frozen=True)
class _Snapshot:
    head: dict[str, torch.Tensor]
    optimizer: dict | None


class RoundJournal:
    """The open round's decoder snapshot, its applied updates in order, and per cluster the step id its current
    attempt started after. Used only under the decoder's lock."""

    def __init__(self) -> None:
        self._snapshot: _Snapshot | None = None
        self._applied: list[Applied] = []
        self._bases: dict[tuple[int, int], int] = {}
        self._pool = TensorPool()
        self._keep = True  # whether the round's requests are kept: more than one cluster admitted

    def open(self, head: torch.nn.Module, optimizer: torch.optim.Optimizer | None, clusters: Collection[int]) -> None:
        """Round t opens for ``clusters``: copy the decoder's weights and optimizer state (into the last round's
        copies where the shapes match: no new memory per round); forget the last round's updates. Requests are
        kept only when more than one cluster is admitted."""
        last = self._snapshot
        weights = _copy_into(head.state_dict(), last.head if last is not None else {})
        state = None
        if optimizer is not None:
            live = optimizer.state_dict()
            kept = last.optimizer["state"] if last is not None and last.optimizer is not None else {}
            tensors = {i: _copy_into(s, kept.get(i, {})) for i, s in live["state"].items()}
            state = {"state": tensors, "param_groups": copy.deepcopy(live["param_groups"])}
        self._snapshot, self._applied, self._bases = _Snapshot(weights, state), [], {}
        self._pool.recycle()
        self._keep = len(set(clusters)) > 1

    def close(self) -> None:
        """The round closed: let go of its requests (the snapshot's memory is kept for the next round)."""
        self._applied, self._bases = [], {}

    def step_of(self, round_: int, cluster: int, seq: int) -> int:
        """The step number (1, 2, ...) of step id ``seq`` within cluster n's current attempt at round t."""
        return int(seq) - self._bases.get((int(round_), int(cluster)), 0)

    def record(self, kind: str, requests: list[StepRequest] | tuple[StepRequest, ...], step: int) -> None:
        """The decoder applied one update (``kind``, its requests, drawn for ``step``): kept as pooled copies when
        the round admits more than one cluster."""
        if self._keep:
            self._applied.append(Applied(kind, tuple(self._pool.request(r) for r in requests), int(step)))

    def restart(
        self, round_: int, cluster: int, seq: int, head: torch.nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> list[Applied]:
        """Cluster n starts a fresh attempt at round t with step id ``seq``: the decoder (weights and optimizer
        state) back as the round opened, and the updates to apply again, in order, without n's (the caller applies
        and records them); n's steps are numbered from 1 again from ``seq`` on."""
        if self._snapshot is None:
            raise RuntimeError("the decoder's round journal is not open; open_round first")
        head.load_state_dict(self._snapshot.head)
        if optimizer is not None and self._snapshot.optimizer is not None:
            optimizer.load_state_dict(copy.deepcopy(self._snapshot.optimizer))
        kept = [a for a in (entry.without(cluster) for entry in self._applied) if a is not None]
        self._applied = []
        self._bases[(int(round_), int(cluster))] = int(seq) - 1
        return kept


def _copy_into(live: dict, kept: dict) -> dict:
    """A copy of ``live``'s values: tensors copied into ``kept``'s of the same shape and dtype (else cloned),
    anything else (an optimizer's plain numbers) as is."""
    out = {}
    for key, value in live.items():
        if not torch.is_tensor(value):
            out[key] = copy.deepcopy(value)
            continue
        buffer = kept.get(key)
        if isinstance(buffer, torch.Tensor) and buffer.shape == value.shape and buffer.dtype == value.dtype:
            out[key] = buffer.copy_(value.detach())
        else:
            out[key] = value.detach().clone()
    return out
