"""What the CU's driver may do with the devices of one cluster, whatever the backend (:class:`Stages`).

``put(value) -> handle`` and the ``submit_*`` calls (``submit_forward(stage, i, x, mask) -> handle``, ...) give
handles, ``get(handle, stage) -> value`` waits for one. A handle may be passed as an argument of a later submit:
locally it is the value itself, on Ray an ObjectRef, so stage k+1 starts on micro-batch i as soon as stage k
finishes it, without a round trip through the CU, while stage k goes on with micro-batch i+1.

Every call on a device is a typed method of :class:`Stages` named after the
:class:`~collapipe_flwr.pipeline.stage.Stage` method it runs: ``submit_<method>(stage, ...)`` starts it on a stage
of the current plan and answers a handle (a failure names the first stage of the step not done); ``<method>(k,
...)`` runs it on device k and waits for its answer (a failure names device k).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.pipeline.device_process import DeviceProcess


@dataclass(frozen=True)
class StageSpec:
    """What pipeline stage s is to hold when a plan is placed (:meth:`Stages.place`: stage s = ``specs[s]``).

    device: k, the cluster's device that runs the stage.
    segment: its delta_k consecutive TEBs, blocks [offset, offset + delta_k) of the encoder numbered from 0 within
        the segment; None keeps what device k holds (a plan whose segments the devices hold already, or a device
        started idle).
    optimizer_state: the segment's optimizer moments in its own block numbers; None: fresh moments.
    slowdown: the emulated slowdown max_j(phi_j f_j) / (phi_k f_k) >= 1 of device k (``runtime.emulate``,
        ``stage.emulation_slowdowns``); 1 runs at full speed.
    offset: the encoder's number of the segment's first block, sum of delta_k' over the devices k' before k.
    """

    device: int
    segment: nn.ModuleList | None = None
    optimizer_state: dict | None = None
    slowdown: float = 1.0
    offset: int = 0


class Stages(Protocol):
    """What the CU's driver may do with the devices of one cluster, whatever the backend."""

    backend: str

    def place(self, specs: Sequence[StageSpec], free_others: bool = True) -> None:
        """Make stage s = device specs[s].device, loading each spec's segment (when not None) into it."""

    def start_idle(self, devices: Sequence[int], warm_modules: Sequence[str] = ()) -> None:
        """Have ``devices`` ready (holding no blocks) before a plan uses them, each importing ``warm_modules``
        (the blocks' code) in the background."""

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""

    # -- one step's calls on the stages of the plan (handles; ``get`` waits) ---------------------------
    def new_step(self) -> None:
        """Start a new batch of submits (failure reports name the first one not done)."""

    def put(self, value) -> Any:
        """A handle on ``value`` that later submits may take as an argument."""

    def submit_begin_step(self, stage: int, step_seed: int | None, micro_batches: int | None = None) -> Any:
        """Start ``Stage.begin_step(step_seed, micro_batches)`` on stage ``stage`` (m: which micro-batches
        ``pipeline.checkpoint`` re-materializes); return its handle."""

    def submit_forward(self, stage: int, mb_index: int, x: Any, attention_mask: Any) -> Any:
        """Start ``Stage.forward`` of micro-batch ``mb_index`` (``x``, ``attention_mask``: values or handles)."""

    def submit_backward(self, stage: int, mb_index: int, grad_out: Any) -> Any:
        """Start ``Stage.backward`` of micro-batch ``mb_index`` (``grad_out``: a value or a handle)."""

    def submit_step(self, stage: int, lr_factor: float) -> Any:
        """Start ``Stage.step(lr_factor)``: the stage's optimizer update (its handle answers ``StageSeconds``:
        compute and D2D link)."""

    def submit_get_weights(self, stage: int) -> Any:
        """Start ``Stage.get_weights()``: theta^s with local block numbers."""

    def submit_set_weights(self, stage: int, state: dict) -> Any:
        """Start ``Stage.set_weights(state)`` (local block numbers)."""

    def submit_trace(self, stage: int) -> Any:
        """Start ``Stage.trace()``: the last step's (F|B, micro-batch, wall start, wall end) calls."""

    def submit_memory_report(self, stage: int) -> Any:
        """Start ``Stage.memory_report()``: the bytes the stage's device holds."""

    def get(self, handle, stage: int) -> Any:
        """The value of ``handle`` (from stage ``stage``), waiting for it."""

    # -- calls on one device k, answered at once ---------------------------------------------------------
    def get_weights(self, k: int) -> dict:
        """Device k's ``Stage.get_weights()``."""

    def get_optimizer_state(self, k: int) -> dict:
        """Device k's ``Stage.get_optimizer_state()``."""

    def load_optimizer_state(self, k: int, state: dict) -> None:
        """Device k's ``Stage.load_optimizer_state(state)``."""

    def reset_optimizer(self, k: int) -> None:
        """Device k's ``Stage.reset_optimizer()``."""

    def set_testbed(
        self, k: int, cores: float, bytes_per_s: float, latency_s: float, cgroup_name: str, memory_bytes: float
    ) -> float:
        """Device k's ``Stage.set_testbed(...)``: the cores its cgroup grants, read back."""

    def clear_testbed(self, k: int) -> None:
        """Device k's ``Stage.clear_testbed()``."""

    def profile_compute(
        self, k: int, block: nn.Module, sizes: list[int], seq_len: int, width: int, repeats: int
    ) -> dict:
        """Device k's ``Stage.profile_compute(...)``: its timings of one TEB and the memory it may use."""

    def process(self, k: int) -> DeviceProcess:
        """Device k's ``Stage.process()``: its OS process and network namespace."""

    def missing_modules(self, k: int, modules: Sequence[str]) -> list[str]:
        """Device k's ``Stage.missing_modules(modules)``: those its process has not imported."""

    # -- the devices ---------------------------------------------------------------------------------------
    def processes(self) -> dict[int, DeviceProcess]:
        """{device k: the OS process holding it and that process's network namespace}; an idle device (no blocks in
        the current plan) that gives no answer is forgotten and kept for :meth:`take_idle_losses` instead of failing
        the call."""

    def take_idle_losses(self) -> list[DeviceFailure]:
        """The devices found dead while the plan left them idle, since the last take (forgotten already)."""

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to hand an ``nbytes`` payload from device ``src`` to device ``dst`` on this backend's transport
        (through ``src``'s link throttle on the testbed)."""

    def forget(self, k: int) -> None:
        """Drop device k (it failed): stop it if it still runs; later placements never use it."""

    def shutdown(self) -> None:
        """Stop every device of this cluster."""
