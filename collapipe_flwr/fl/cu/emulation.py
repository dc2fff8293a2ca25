"""The CU's side of the emulated testbed and of measured profiles (docs/testbed.md).

The server sends, with a round's train instructions, what the testbed imposes on this cluster
(:class:`~collapipe_flwr.system.profile.DeviceEmulation`: CPU quotas, D2D rates, the uplink rate of the channel
and power DSSRA chose) and whether to measure the devices this round. Here the CU applies the quotas and link
throttles to its device actors, passes its z_enc frames and its weight upload through an uplink token bucket
(eq. 10's Shannon rate R_n), measures the devices and links when asked, and reports its own time per step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from collapipe_flwr.pipeline.cluster import ClusterPipeline
from collapipe_flwr.system.profile import ClusterProfile, DeviceEmulation
from collapipe_flwr.testbed.token_bucket import TokenBucket

UPLINK_BURST_BYTES = 4096  # each frame then takes its bytes / R_n, as eq. (11)'s tau^Up does


def tensor_bytes(tensors: Sequence[torch.Tensor], wire: str = "none") -> int:
    """Bytes ``tensors`` take on the data plane's wire: float32, or 2 / 1 bytes per value compressed."""
    per_value = {"none": 4, "fp16": 2, "int8": 1}.get(wire, 4)
    return sum(int(t.numel()) * per_value for t in tensors)


class ThrottledHead:
    """The remote head with the CU's uplink in front: each step's z_enc waits for its bytes at R_n first (the
    gradients coming back are the downlink, which the paper does not model). ``waited_s`` sums the waits."""

    def __init__(self, head, bucket: TokenBucket, wire: str = "none") -> None:
        self.head = head
        self.bucket = bucket
        self.wire = wire
        self.waited_s = 0.0

    def __call__(self, z_enc, micro, lr_factor: float = 1.0):
        start = time.perf_counter()
        self.bucket.consume(tensor_bytes(z_enc, self.wire))
        self.waited_s += time.perf_counter() - start
        return self.head(z_enc, micro, lr_factor)

    # 1F1B (pipeline.schedule: 1f1b): each micro-batch's z_enc waits for its bytes before its own exchange
    def begin_step(self, micro, lr_factor: float = 1.0) -> None:
        self.head.begin_step(micro, lr_factor)

    def micro_step(self, i: int, z):
        start = time.perf_counter()
        self.bucket.consume(tensor_bytes([z], self.wire))
        self.waited_s += time.perf_counter() - start
        return self.head.micro_step(i, z)

    def end_step(self) -> float:
        return self.head.end_step()

    def restart_attempt(self) -> None:
        self.head.restart_attempt()

    def close(self) -> None:
        if hasattr(self.head, "close"):
            self.head.close()


def uplink_bucket(emulation: DeviceEmulation | None) -> TokenBucket | None:
    """The CU's uplink token bucket at R_n (bytes/s), or None when the testbed does not throttle it."""
    if emulation is None or emulation.uplink_bytes_per_s <= 0:
        return None
    return TokenBucket(emulation.uplink_bytes_per_s, UPLINK_BURST_BYTES)


def upload(bucket: TokenBucket | None, weights: dict[str, dict[str, torch.Tensor]]) -> float:
    """Hold the reply for its weights' bytes at R_n (eq. 11's theta_enc term); returns the seconds held."""
    if bucket is None:
        return 0.0
    nbytes = sum(int(t.numel() * t.element_size()) for part in weights.values() for t in part.values())
    start = time.perf_counter()
    bucket.consume(nbytes)
    return time.perf_counter() - start


def apply_emulation(pipeline: ClusterPipeline, emulation: DeviceEmulation, cluster: int) -> list[float]:
    """Every live device of the cluster under its CPU quota and link throttle; the cores each cgroup grants
    (read back), 0 where no quota is set or the device is not alive."""
    granted = pipeline.testbed.set_testbed(emulation, cgroup_prefix=f"c{cluster}")
    return [float(granted.get(k, 0.0)) for k in range(len(emulation.cpu_cores))]


def cu_step_seconds(step_seconds: dict[str, float], steps: int, uplink_wait_s: float) -> float:
    """The CU's own time per step outside the devices: embedding and the data-plane exchange with the server's
    decoder, less the emulated radio time of z_enc (which eq. 26's uplink term already counts)."""
    if steps <= 0:
        return 0.0
    own = step_seconds.get("embed", 0.0) + step_seconds.get("head", 0.0) - uplink_wait_s
    return max(0.0, own / steps)


def with_cu_step(profile: ClusterProfile | None, K: int, cu_step_s: float, t: int) -> ClusterProfile:
    """The round's report: the devices measured this round (or none) and the CU's time per step."""
    if profile is None:
        profile = ClusterProfile((None,) * K, (None,) * K)
    return replace(profile, cu_step_s=cu_step_s, measured_round=t)
