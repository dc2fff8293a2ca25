"""The typed calls of :class:`~collapipe_flwr.pipeline.executors.interface.Stages` as calls on Ray actors
(:class:`RayStageCalls`, a base of :class:`~collapipe_flwr.pipeline.executors.ray_stages.RayStages`).

``submit_<method>(stage, ...)`` starts ``<method>`` on the actor of stage ``stage`` of the current plan and answers
its ObjectRef, remembered for the step's failure report (``RayStages.new_step`` / ``RayStages.get``); with
``runtime.handoff: shm`` the CU's own tensors among its arguments are parked in shared memory first.
``<method>(k, ...)`` runs it on device k's actor and waits for the answer, a failure naming device k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.pipeline.device_process import DeviceProcess
from collapipe_flwr.pipeline.executors import shm_handoff
from collapipe_flwr.pipeline.executors.ray_actor import DeviceActor, RemoteMethod
from collapipe_flwr.pipeline.runtime_spec import Handoff


class RayStageCalls:
    """One method per stage call of the :class:`Stages` protocol, each on the actor handle's typed method."""

    devices: dict[int, DeviceActor]  # device k -> its actor
    actors: list[DeviceActor]  # stage s -> its device's actor
    handoff: Handoff
    _parking: shm_handoff.ParkingLot
    _submitted: list[tuple[Any, int]]  # (ObjectRef, stage) of this step's submits, in submission order
    device_indices: list[int]  # stage s -> its device k
    idle_losses: list[DeviceFailure]  # devices found dead while the plan left them idle, not yet taken

    def forget(self, k: int) -> None:
        """Drop device k's actor, never used again (``RayStages.forget``)."""
        raise NotImplementedError

    def _get_device(self, ref: Any, k: int) -> Any:
        """The value of ``ref`` from device k, which a failure names (``RayStages._get_device``)."""
        raise NotImplementedError

    def _submit(self, stage: int, method: RemoteMethod, *args: Any) -> Any:
        # the CU's own tensors (embedding output, the head's gradients, weights) take the shm hand-over too
        ref = method.remote(*(self._tree(a) for a in args))
        self._submitted.append((ref, stage))
        return ref

    # -- one step's calls on the stages of the plan ----------------------------------------------------------
    def submit_begin_step(self, stage: int, step_seed: int | None, micro_batches: int | None = None) -> Any:
        return self._submit(stage, self.actors[stage].begin_step, step_seed, micro_batches)

    def submit_forward(self, stage: int, mb_index: int, x: Any, attention_mask: Any) -> Any:
        return self._submit(stage, self.actors[stage].forward, mb_index, x, attention_mask)

    def submit_backward(self, stage: int, mb_index: int, grad_out: Any) -> Any:
        return self._submit(stage, self.actors[stage].backward, mb_index, grad_out)

    def submit_step(self, stage: int, lr_factor: float) -> Any:
        return self._submit(stage, self.actors[stage].step, lr_factor)

    def submit_get_weights(self, stage: int) -> Any:
        return self._submit(stage, self.actors[stage].get_weights)

    def submit_set_weights(self, stage: int, state: dict) -> Any:
        return self._submit(stage, self.actors[stage].set_weights, state)

    def submit_trace(self, stage: int) -> Any:
        return self._submit(stage, self.actors[stage].trace)

    def submit_memory_report(self, stage: int) -> Any:
        return self._submit(stage, self.actors[stage].memory_report)

    # -- calls on one device k, answered at once -------------------------------------------------------------
    def _tree(self, value: Any) -> Any:
        """``value`` with its tensors parked in shared memory when the hand-over is ``shm`` (weights and optimizer
        state then bypass Ray's object store both ways, ``shm_handoff.ParkingLot.handover_tree``)."""
        return self._parking.handover_tree(value) if self.handoff is Handoff.SHM else value

    def get_weights(self, k: int) -> dict:
        return shm_handoff.resolve_tree(self._get_device(self.devices[k].get_weights.remote(), k))

    def get_optimizer_state(self, k: int) -> dict:
        return shm_handoff.resolve_tree(self._get_device(self.devices[k].get_optimizer_state.remote(), k))

    def load_optimizer_state(self, k: int, state: dict) -> None:
        self._get_device(self.devices[k].load_optimizer_state.remote(self._tree(state)), k)

    def reset_optimizer(self, k: int) -> None:
        self._get_device(self.devices[k].reset_optimizer.remote(), k)

    def set_testbed(
        self, k: int, cores: float, bytes_per_s: float, latency_s: float, cgroup_name: str, memory_bytes: float
    ) -> float:
        ref = self.devices[k].set_testbed.remote(cores, bytes_per_s, latency_s, cgroup_name, memory_bytes)
        return self._get_device(ref, k)

    def clear_testbed(self, k: int) -> None:
        self._get_device(self.devices[k].clear_testbed.remote(), k)

    def profile_compute(
        self, k: int, block: nn.Module, sizes: list[int], seq_len: int, width: int, repeats: int
    ) -> dict:
        return self._get_device(self.devices[k].profile_compute.remote(block, sizes, seq_len, width, repeats), k)

    def process(self, k: int) -> DeviceProcess:
        return self._get_device(self.devices[k].process.remote(), k)

    def missing_modules(self, k: int, modules: Sequence[str]) -> list[str]:
        return self._get_device(self.devices[k].missing_modules.remote(modules), k)

    # -- the devices -----------------------------------------------------------------------------------------
    def processes(self) -> dict[int, DeviceProcess]:
        """{device k: its actor's process and network namespace} of every live device (tests check actors are reused
        across rounds and run on the boxes they were placed on). A device the plan leaves idle that gives no answer
        takes no part in the round: it is forgotten (never used again) and its failure kept for
        :meth:`take_idle_losses`; a device holding blocks raises :class:`DeviceFailure` as every call does."""
        out: dict[int, DeviceProcess] = {}
        for k in sorted(self.devices):
            try:
                out[k] = self.process(k)
            except DeviceFailure as failure:
                if k in self.device_indices:
                    raise
                self.forget(k)
                self.idle_losses.append(failure)
        return out

    def take_idle_losses(self) -> list[DeviceFailure]:
        """The idle devices found dead since the last take (:meth:`processes`), each a :class:`DeviceFailure`."""
        taken, self.idle_losses = self.idle_losses, []
        return taken
