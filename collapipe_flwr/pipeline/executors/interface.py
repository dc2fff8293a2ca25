"""What the CU's driver may do with the devices of one cluster, whatever the backend (:class:`Stages`).

``put(value) -> handle`` and ``submit(stage, method, *args) -> handle`` give handles, ``get(handle, stage) ->
value`` waits for one. A handle may be passed as an argument of a later ``submit``: locally it is the value
itself, on Ray an ObjectRef, so stage k+1 starts on micro-batch i as soon as stage k finishes it, without a round
trip through the CU, while stage k goes on with micro-batch i+1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torch import nn

from collapipe_flwr.pipeline.device_process import DeviceProcess

# (device index k, segment or None = keep what the device holds, optimizer state, slowdown, first block index)
StageSpec = tuple[int, "nn.ModuleList | None", "dict | None", float, int]
BACKENDS = ("local", "ray")


class Stages(Protocol):
    """What the CU's driver may do with the devices of one cluster, whatever the backend."""

    backend: str

    def place(self, specs: Sequence[StageSpec], free_others: bool = True) -> None:
        """Make stage s = device specs[s].k, loading each spec's segment (when not None) into it."""

    def start_idle(self, devices: Sequence[int], warm_modules: Sequence[str] = ()) -> None:
        """Have ``devices`` ready (holding no blocks) before a plan uses them, each importing ``warm_modules``
        (the blocks' code) in the background."""

    def layout(self) -> dict[int, tuple[int, int]]:
        """{device k: (first block, last block + 1)} of every live device."""

    def call_device(self, k: int, method: str, *args) -> Any:
        """Call ``method`` on device k and wait for its answer."""

    def new_step(self) -> None:
        """Start a new batch of ``submit`` calls (failure reports name the first one not done)."""

    def put(self, value) -> Any:
        """A handle on ``value`` that later submits may take as an argument."""

    def submit(self, stage: int, method: str, *args) -> Any:
        """Start ``method`` on stage ``stage`` (arguments may be handles); return its handle."""

    def get(self, handle, stage: int) -> Any:
        """The value of ``handle`` (from stage ``stage``), waiting for it."""

    def processes(self) -> dict[int, DeviceProcess]:
        """{device k: the OS process holding it and that process's network namespace}."""

    def time_transfer(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to hand an ``nbytes`` payload from device ``src`` to device ``dst`` on this backend's transport
        (through ``src``'s link throttle on the testbed)."""

    def forget(self, k: int) -> None:
        """Drop device k (it failed): stop it if it still runs; later placements never use it."""

    def shutdown(self) -> None:
        """Stop every device of this cluster."""
