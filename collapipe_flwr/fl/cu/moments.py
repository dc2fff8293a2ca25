"""Where a CU keeps its optimizer moments between rounds: one interface (:class:`MomentStore`), two places.

A :class:`~collapipe_flwr.fl.cu.cluster_session.ClusterSession` holds the moments while its process lives; a round
that starts without them (another CU process, a resumed run) asks the round's moment stores, in order, for the
moments of this run's last round, and after every round it hands them the moments again:

- :class:`ContextMoments`: Flower's per-node ``Context.state``, so that a round landing in another CU process of
  the same run finds what the last round left (Flower's simulation runs a node's messages on any worker of its
  pool; a deployed SuperNode starts a process per message). It keeps what the CU process holds: the
  embedding's moments, a CU-side head's, and the segments' on the in-process ``local`` backend.
- :class:`DiskMoments`: the CU's half of the run's checkpoint on its own disk (``fl/cu/cu_checkpoint.py``),
  every moment, the device actors' included, for the first round of a resumed run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from collapipe_flwr.fl.cu.cu_checkpoint import load_cu_state, remove_cu_state, save_cu_state

STATE_ARRAYS = "collapipe.cu-optimizer"  # Context.state ArrayRecord: flattened optimizer moments
STATE_INFO = "collapipe.cu-info"  # Context.state ConfigRecord: {"session": run key, "round": t}


class MomentStore(Protocol):
    """A place that keeps a CU's optimizer moments, flattened ``part|param|moment``, between rounds of one run."""

    @property
    def with_devices(self) -> bool:
        """Whether it keeps the device actors' moments too (else what the CU process itself holds)."""
        ...

    def save(self, round_: int, tensors: dict[str, torch.Tensor]) -> None:
        """Keep the moments after round ``round_``. The tensors are read before this returns, so a caller may
        hand over the live ones (at BERT-base size the encoder's moments are 680 MB)."""
        ...

    def load(self, before_round: int) -> dict[str, torch.Tensor] | None:
        """The moments saved after this run's last round before ``before_round``; None when there are none."""
        ...


@dataclass(frozen=True)
class ContextMoments:
    """The moments in Flower's ``Context.state`` of this node, tagged with the run (``run_key``) and round."""

    state: RecordDict
    run_key: str
    with_devices: ClassVar[bool] = False

    def save(self, round_: int, tensors: dict[str, torch.Tensor]) -> None:
        """Serialized into the state's records at once (Flower's ArrayRecord copies the bytes)."""
        self.state.array_records[STATE_ARRAYS] = ArrayRecord(torch_state_dict=tensors)
        self.state.config_records[STATE_INFO] = ConfigRecord({"session": self.run_key, "round": int(round_)})

    def load(self, before_round: int) -> dict[str, torch.Tensor] | None:
        """What this run's last round left in the state; None for none, another run's or a later round's."""
        if STATE_ARRAYS not in self.state.array_records or STATE_INFO not in self.state.config_records:
            return None
        info = self.state.config_records[STATE_INFO]
        saved_round = info.get("round")
        if str(info.get("session")) != self.run_key or not isinstance(saved_round, int) or saved_round >= before_round:
            return None
        return self.state.array_records[STATE_ARRAYS].to_torch_state_dict()


@dataclass(frozen=True)
class DiskMoments:
    """The moments in the CU's checkpoint file of the run named ``key`` (fl/cu/cu_checkpoint.py)."""

    key: str
    cluster: int
    with_devices: ClassVar[bool] = True

    def save(self, round_: int, tensors: dict[str, torch.Tensor]) -> None:
        """Written at once (safetensors, replaced atomically)."""
        save_cu_state(self.key, self.cluster, round_, tensors)

    def load(self, before_round: int) -> dict[str, torch.Tensor] | None:
        """The file's moments when it holds an earlier round's; a file that cannot be used is a CUStateError."""
        return load_cu_state(self.key, self.cluster, before=before_round)

    def discard(self) -> None:
        """The run is over: the file goes (nothing will resume the run)."""
        remove_cu_state(self.key, self.cluster)


def round_moments(state: RecordDict | None, run_key: str, cluster: int, state_key: str) -> tuple[MomentStore, ...]:
    """Where a round of (run, cluster) keeps its moments, in the order a round restores them: Flower's
    ``Context.state`` when the message has one (the last round's), then the disk when the server keeps a
    checkpoint of the run (``state_key``: a resumed run's last round before this one)."""
    stores: list[MomentStore] = []
    if state is not None:
        stores.append(ContextMoments(state, run_key))
    if state_key:
        stores.append(DiskMoments(state_key, cluster))
    return tuple(stores)
