"""``federation.decoder_update`` as one protocol, chosen once when the decoder host is built.

How a CU's step reaches the server's decoder (Algorithm 1, line 14), three ways:

- :class:`PerCu` (``per_cu``): each step alone under the decoder's lock, in arrival order;
- :class:`Ordered` (``ordered``): each step alone, in cluster order (the turnstile of :mod:`.ordered`);
- :class:`Joint` (``joint``): step seq of every cluster in one update (the barrier of :mod:`.joint`); a cluster
  left out of the barrier is served alone.

:class:`~.frame_service.FrameService` holds one :class:`DecoderUpdate` and never asks which it is, as Flower
picks a strategy object and peft maps its ``PeftType`` to a tuner class (:data:`MODES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import torch

from collapipe_flwr.config.sections import DecoderUpdateMode
from collapipe_flwr.fl.dataplane.protocol import StepRequest
from collapipe_flwr.fl.dataplane.wire import Frame
from collapipe_flwr.fl.server.decoder.joint import JointSteps, StepResults
from collapipe_flwr.fl.server.decoder.ordered import OrderedSteps

Alone = Callable[[StepRequest], Frame]  # run the step alone under the decoder's lock; its reply frame
Joined = Callable[[StepRequest, tuple[float, list[torch.Tensor]]], Frame]  # a joint step's share -> reply frame


class DecoderUpdate(Protocol):
    """How steps reach the decoder: the round opens and closes, a CU leaves (its stream ended cleanly), a claimed
    step is skipped (refused after its id was claimed), and a step is applied (:meth:`apply`)."""

    name: DecoderUpdateMode
    whole_steps_only: bool  # 1F1B parts (one exchange per micro-batch) cannot be gathered or ordered

    def open_round(self, round_: int, clusters: Iterable[int]) -> None: ...

    def close_round(self) -> None: ...

    def leave(self, round_: int, cluster: int) -> None: ...

    def skip(self, round_: int, cluster: int, seq: int) -> None: ...

    def apply(self, req: StepRequest, alone: Alone, joined: Joined) -> Frame: ...


class PerCu:
    """One decoder update per CU step, in arrival order: CUs never wait for each other."""

    name = DecoderUpdateMode.PER_CU
    whole_steps_only = False

    def open_round(self, round_: int, clusters: Iterable[int]) -> None:
        pass

    def close_round(self) -> None:
        pass

    def leave(self, round_: int, cluster: int) -> None:
        pass

    def skip(self, round_: int, cluster: int, seq: int) -> None:
        pass

    def apply(self, req: StepRequest, alone: Alone, joined: Joined) -> Frame:
        return alone(req)


class Ordered(PerCu):
    """One decoder update per CU step, step seq of the clusters in cluster order (:mod:`.ordered`), so two runs
    with the same seed apply the same steps in the same order."""

    name = DecoderUpdateMode.ORDERED
    whole_steps_only = True

    def __init__(self, timeout_s: float) -> None:
        self.steps = OrderedSteps(timeout_s=timeout_s)

    def open_round(self, round_: int, clusters: Iterable[int]) -> None:
        self.steps.open_round(round_, clusters)

    def close_round(self) -> None:
        self.steps.close_round()

    def leave(self, round_: int, cluster: int) -> None:
        self.steps.leave(round_, cluster)

    def skip(self, round_: int, cluster: int, seq: int) -> None:
        """The claimed step can never come again: its slot must not hold the order."""
        self.steps.skip(round_, cluster, seq)

    def apply(self, req: StepRequest, alone: Alone, joined: Joined) -> Frame:
        with self.steps.turn(req):  # its slot is resolved however the step ends (served or refused)
            return alone(req)


class Joint(PerCu):
    """One decoder update on step seq of every cluster (:mod:`.joint`); ``run_step`` runs it under the decoder's
    lock and gives each cluster its loss and gradients."""

    name = DecoderUpdateMode.JOINT
    whole_steps_only = True

    def __init__(self, run_step: Callable[[list], StepResults], timeout_s: float) -> None:
        self.steps = JointSteps(run_step, timeout_s=timeout_s)

    def open_round(self, round_: int, clusters: Iterable[int]) -> None:
        self.steps.open_round(round_, clusters)

    def close_round(self) -> None:
        self.steps.close_round()

    def apply(self, req: StepRequest, alone: Alone, joined: Joined) -> Frame:
        share = self.steps.submit(req)
        return alone(req) if share is None else joined(req, share)


# federation.decoder_update -> its DecoderUpdate, from (the joint step's runner, how long a barrier or turnstile waits)
MODES: dict[DecoderUpdateMode, Callable[[Callable[[list], StepResults], float], DecoderUpdate]] = {
    DecoderUpdateMode.PER_CU: lambda run_joint, timeout_s: PerCu(),
    DecoderUpdateMode.JOINT: Joint,
    DecoderUpdateMode.ORDERED: lambda run_joint, timeout_s: Ordered(timeout_s),
}


def update_mode(
    name: DecoderUpdateMode | str, run_joint: Callable[[list], StepResults], timeout_s: float
) -> DecoderUpdate:
    """The :class:`DecoderUpdate` of ``federation.decoder_update`` = ``name`` (validated at start-up; an unknown one
    here is a bug)."""
    if name not in MODES:
        raise ValueError(f"decoder_update={name!r} is not one of {', '.join(MODES)}")
    return MODES[DecoderUpdateMode(name)](run_joint, timeout_s)
