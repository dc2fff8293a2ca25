"""The stages of one cluster as plain objects in the CU's own process (``runtime.backend: local``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from collapipe_flwr.errors import DeviceFailure
from collapipe_flwr.pipeline.device_process import DeviceProcess
from collapipe_flwr.pipeline.executors.interface import StageSpec
from collapipe_flwr.pipeline.optim import OptimizerSpec
from collapipe_flwr.pipeline.runtime_spec import LOCAL_RUNTIME, ClusterRuntime
from collapipe_flwr.pipeline.stage import Stage, StageCompute
from collapipe_flwr.pipeline.timings import StageSeconds


class LocalStages:
    """Stages as plain objects in this process, one per device index k; calls run immediately, in
    submission order. Like :class:`~collapipe_flwr.pipeline.executors.ray_stages.RayStages` the device objects
    outlive a repartition (:meth:`place`). Of the ``runtime`` only the precision, the device and ``checkpoint``
    matter here."""

    backend = "local"

    def __init__(
        self, specs: Sequence[StageSpec], optimizer: OptimizerSpec, runtime: ClusterRuntime = LOCAL_RUNTIME
    ) -> None:
        self.optimizer = optimizer
        self.precision = runtime.spec.precision
        self.device = runtime.spec.device
        self.checkpoint = runtime.checkpoint
        self.devices: dict[int, Stage] = {}
        self.place(specs)

    def place(self, specs: Sequence[StageSpec], free_others: bool = True) -> None:
        """Make stage s = device specs[s].device; a spec's segment (if not None) replaces what the device held;
        with ``free_others`` a device outside ``specs`` drops its blocks."""
        for spec in specs:
            if spec.device not in self.devices:
                self.devices[spec.device] = Stage(  # a new device with no segment starts idle, as on Ray
                    spec.device,
                    spec.segment if spec.segment is not None else nn.ModuleList(),
                    self.optimizer,
                    optimizer_state=spec.optimizer_state,
                    slowdown=spec.slowdown,
                    offset=spec.offset,
                    compute=StageCompute(device=self.device, precision=self.precision, checkpoint=self.checkpoint),
                )
            elif spec.segment is not None:
                self.devices[spec.device].load_segment(spec.segment, spec.optimizer_state, spec.slowdown, spec.offset)
        self.device_indices = [spec.device for spec in specs]
        self.stages = [self.devices[k] for k in self.device_indices]
        for k, stage in self.devices.items():  # a device the plan leaves idle frees its blocks
            if free_others and specs and k not in self.device_indices and len(stage.segment):
                stage.load_segment(nn.ModuleList(), None, 1.0, 0)

    def start_idle(self, devices: Sequence[int], warm_modules: Sequence[str] = ()) -> None:
        """Nothing to start: a device object here costs no process start-up when a plan first uses it (and the
        blocks' code is imported in this process already)."""

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""
        return {k: stage.layout() for k, stage in self.devices.items()}

    # -- one step's calls: each runs now, its handle is its value -----------------------------------------
    def new_step(self) -> None:
        pass

    def put(self, value):
        """A value later submits may take as an argument (here: the value itself)."""
        return value

    def submit_begin_step(self, stage: int, step_seed: int | None, micro_batches: int | None = None) -> int:
        return self.stages[stage].begin_step(step_seed, micro_batches)

    def submit_forward(self, stage: int, mb_index: int, x: Any, attention_mask: Any) -> torch.Tensor:
        return self.stages[stage].forward(mb_index, x, attention_mask)

    def submit_backward(self, stage: int, mb_index: int, grad_out: Any) -> torch.Tensor:
        return self.stages[stage].backward(mb_index, grad_out)

    def submit_step(self, stage: int, lr_factor: float) -> StageSeconds:
        return self.stages[stage].step(lr_factor)

    def submit_get_weights(self, stage: int) -> dict[str, torch.Tensor]:
        return self.stages[stage].get_weights()

    def submit_set_weights(self, stage: int, state: dict) -> None:
        self.stages[stage].set_weights(state)

    def submit_trace(self, stage: int) -> list[tuple[str, int, float, float]]:
        return self.stages[stage].trace()

    def submit_memory_report(self, stage: int) -> dict:
        return self.stages[stage].memory_report()

    def get(self, handle, stage: int):
        """The value of ``handle`` (here: the handle itself; the call already ran)."""
        return handle

    # -- calls on one device k ---------------------------------------------------------------------------
    def get_weights(self, k: int) -> dict:
        return self.devices[k].get_weights()

    def get_optimizer_state(self, k: int) -> dict:
        return self.devices[k].get_optimizer_state()

    def load_optimizer_state(self, k: int, state: dict) -> None:
        self.devices[k].load_optimizer_state(state)

    def reset_optimizer(self, k: int) -> None:
        self.devices[k].reset_optimizer()

    def set_testbed(
        self, k: int, cores: float, bytes_per_s: float, latency_s: float, cgroup_name: str, memory_bytes: float
    ) -> float:
        return self.devices[k].set_testbed(cores, bytes_per_s, latency_s, cgroup_name, memory_bytes)

    def clear_testbed(self, k: int) -> None:
        self.devices[k].clear_testbed()

    def profile_compute(
        self, k: int, block: nn.Module, sizes: list[int], seq_len: int, width: int, repeats: int
    ) -> dict:
        return self.devices[k].profile_compute(block, sizes, seq_len, width, repeats)

    def process(self, k: int) -> DeviceProcess:
        return self.devices[k].process()

    def missing_modules(self, k: int, modules: Sequence[str]) -> list[str]:
        return self.devices[k].missing_modules(modules)

    # -- the devices ---------------------------------------------------------------------------------------

    def processes(self) -> dict[int, DeviceProcess]:
        return {k: stage.process() for k, stage in self.devices.items()}

    def take_idle_losses(self) -> list[DeviceFailure]:
        return []  # devices in the CU's own process do not die apart from it

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        start = time.perf_counter()
        self.devices[dst].receive_payload(self.devices[src].send_payload(nbytes))
        return time.perf_counter() - start

    def forget(self, k: int) -> None:
        self.devices.pop(k, None)

    def shutdown(self) -> None:
        self.stages = []
        self.devices = {}
