"""A cluster's devices as the testbed and the measured profiles see them (``system/profile.py``):
:class:`ClusterTestbed` puts the live devices under the testbed's CPU quota, link throttle and memory limit (and
takes them out), and measures a profile (``system.profile: measured``): each live device's TEB forward + backward
timed at the micro-batch sizes Sub-1 may choose, and the link out of each device, fitted (:func:`measure_cluster`)."""

from __future__ import annotations

import statistics

from torch import nn

from collapipe_flwr.pipeline.executors import Stages
from collapipe_flwr.pipeline.profiling import candidate_sizes
from collapipe_flwr.system.profile import (
    ClusterProfile,
    DeviceEmulation,
    DeviceMeasurement,
    LinkMeasurement,
    fit_chunk_cost,
    fit_link,
)


class ClusterTestbed:
    """The testbed's emulation of one cluster's live devices (``stages``) and their measured profile."""

    def __init__(self, stages: Stages) -> None:
        self.stages = stages
        self.on_testbed = False  # set_testbed was called: clear_testbed has quotas and throttles to undo

    def live_devices(self) -> list[int]:
        """The devices k whose actors are alive (holding blocks or idle), in index order."""
        return sorted(self.stages.layout())

    def set_testbed(self, emulation: DeviceEmulation, cgroup_prefix: str) -> dict[int, float]:
        """Put every live device under the testbed's CPU quota, link throttle and memory limit gamma_k^max of
        ``emulation`` (one entry per device k); returns {k: cores its cgroup grants, read back}. A device the OS
        cannot throttle or limit raises TestbedError (never a silent unthrottled or unlimited run)."""
        self.on_testbed = True
        memory = emulation.memory_bytes or (0.0,) * len(emulation.cpu_cores)
        return {
            k: float(
                self.stages.set_testbed(
                    k,
                    emulation.cpu_cores[k],
                    emulation.d2d_bytes_per_s[k],
                    emulation.d2d_latency_s[k],
                    f"{cgroup_prefix}d{k}",
                    memory[k],
                )
            )
            for k in self.live_devices()
        }

    def clear_testbed(self) -> None:
        """Back to unthrottled devices; nothing to do (no call to the devices) when the testbed was never set, so
        a run without one pays nothing per round."""
        if not self.on_testbed:
            return
        for k in self.live_devices():
            self.stages.clear_testbed(k)
        self.on_testbed = False

    def measure(
        self, K: int, block: nn.Module, batch_size_b: int, seq_len: int, width: int, repeats: int = 3
    ) -> ClusterProfile:
        """Time every live device's TEB (a copy of ``block``) and the link out of it (:func:`measure_cluster`)."""
        return measure_cluster(self.stages, K, block, batch_size_b, seq_len, width, repeats)


def measure_cluster(
    stages: Stages, K: int, block: nn.Module, batch_size_b: int, seq_len: int, width: int, repeats: int = 3
) -> ClusterProfile:
    """Time every live device's TEB (a copy of ``block``) forward + backward at the micro-batch sizes Sub-1 may
    choose and the link out of each device with activation-sized payloads, one device at a time (so they do not
    share cores while timed), and fit them. Devices not alive get no measurement (K: the cluster's devices).

    The ``repeats`` timing windows of the devices are interleaved (device 0, 1, .., K-1, then again), and each
    size's figure is the median over its windows: a load that comes and goes on a shared host then lands on
    every device alike, so the devices' ratios (what Sub-1 decides from) hold where absolute times drift."""
    live = sorted(stages.layout())
    devices = _measure_devices(stages, live, K, block, candidate_sizes(batch_size_b), seq_len, width, repeats)
    links: list[LinkMeasurement | None] = [None] * K
    full = 4 * batch_size_b * seq_len * width  # z^s of a whole batch in float32: the largest micro-batch
    payloads = [max(1024, full // 16), full]
    for i, k in enumerate(live):
        dst = live[(i + 1) % len(live)]
        seconds = []
        for size in payloads:
            times = sorted(stages.time_transfer(k, dst, size) for _ in range(repeats + 1))[:repeats]
            seconds.append(times[len(times) // 2])
        links[k] = fit_link(payloads, seconds)
    return ClusterProfile(tuple(devices), tuple(links))


def _measure_devices(
    stages: Stages, live: list[int], K: int, block: nn.Module, sizes: list[int], seq_len: int, width: int, repeats: int
) -> list[DeviceMeasurement | None]:
    """Each live device's fitted chunk cost c0_k + b_hat s_k from interleaved timing windows, and its memory."""
    windows: dict[int, list[list[float]]] = {k: [] for k in live}
    memory: dict[int, float] = {}
    for _ in range(max(1, repeats)):
        for k in live:
            raw = stages.profile_compute(k, block, sizes, seq_len, width, 1)
            windows[k].append(raw["seconds"])
            memory[k] = raw["memory_bytes"]
    devices: list[DeviceMeasurement | None] = [None] * K
    for k in live:
        seconds = [statistics.median(column) for column in zip(*windows[k])]
        c0, s = fit_chunk_cost(sizes, seconds)
        devices[k] = DeviceMeasurement(seconds_per_sample_block=s, microbatch_s=c0, memory_bytes=memory[k])
    return devices
