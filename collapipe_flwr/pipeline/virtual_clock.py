"""The virtual clock: how long a cluster's round would take on the devices the network describes, computed from
what the host measured, never waited for (``clock: wall | virtual``, docs/testbed.md "The virtual clock").

FedScale's answer to "many devices, few cores": training runs for real at the host's full speed, and each
participant's time is its measured work scaled by its device's speed, plus network time from a model. Here:

* **compute**: every forward, backward and update a device runs is timed in CPU seconds of the thread that ran it
  (``time.thread_time``: what the host's core spent on it, whatever else shared the core), and becomes
  ``cpu_s x scale_k`` virtual seconds on device k, with ``scale_k = host speed / phi_k f_k`` (the host's FLOP
  rate, measured once per run, over the device's, configured or measured; on the emulated testbed 1 / the cores
  of its CPU quota);
* **D2D** (eq. 13): a hand-over of ``bytes`` from device k to the next stage holds device k's link for
  ``bytes / r_k^dd + tau_0 / 2`` (tau_0 split over a micro-batch's two hand-overs, z^s forward and g^s back, as
  the testbed's links do); the CU <-> stage 0 and last stage -> head transfers are not D2D (eq. 15 leaves out
  "the communication between the s-th device and BS");
* **the cluster's step** is the critical path of those call durations in the step's stage order (GPipe or 1F1B,
  :mod:`.schedule`), plus the CU's embedding (its thread's CPU seconds, see below), the head when the CU
  trains it (VanillaFL: on the device of the last stage, so scaled as that device), and the z^enc uplink
  (eq. 11: bytes / R_n, R_n the Shannon rate of the channel and power DSSRA chose). The CU's own work (its
  embedding, and its set-up in ``fl/cu``) is its thread's CPU seconds x ``cu_scale`` (host speed / the CU's,
  ``clock.cu_flops``; 1 = the host's own seconds).

The server adds its decoder's CPU seconds per cluster and its aggregation (``fl/server``), and a round is the
slowest selected cluster plus the server's part. What is measured and what is modelled stays apart in the parts
(:class:`VirtualSteps`): compute and CU are measured CPU seconds (scaled), D2D and uplink are modelled from bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

from collapipe_flwr.pipeline.schedule import stage_order_critical_path_s
from collapipe_flwr.pipeline.timings import CallCpu


@dataclass(frozen=True)
class ClusterClock:
    """The rates of cluster n's virtual clock in round t, per device k: ``scale`` (virtual seconds per CPU
    second of the host), ``d2d_bytes_per_s`` (r_k^dd / 8; 0 = no D2D time) and ``d2d_latency_s`` (tau_0 of a
    micro-batch's two hand-overs); and ``uplink_bytes_per_s`` (R_n / 8, eq. 10; 0 = no uplink time),
    ``host_flops`` (the host's measured FLOP rate the scales came from; 0 on the testbed, whose scales are its
    quotas) and ``cu_scale`` (virtual seconds per host CPU second of the CU's own work, its embedding and set-up:
    host_flops / clock.cu_flops; 1 = the host's own seconds)."""

    scale: tuple[float, ...]
    d2d_bytes_per_s: tuple[float, ...]
    d2d_latency_s: tuple[float, ...]
    uplink_bytes_per_s: float = 0.0
    host_flops: float = 0.0
    cu_scale: float = 1.0

    def __post_init__(self) -> None:
        K = len(self.scale)
        if len(self.d2d_bytes_per_s) != K or len(self.d2d_latency_s) != K:
            raise ValueError(
                f"a cluster clock needs one scale, D2D rate and latency per device, got {K}, "
                f"{len(self.d2d_bytes_per_s)} and {len(self.d2d_latency_s)}"
            )
        scales = (*self.scale, self.cu_scale)
        values = (*scales, *self.d2d_bytes_per_s, *self.d2d_latency_s, self.uplink_bytes_per_s, self.host_flops)
        if any(not (v >= 0.0 and v < float("inf")) for v in values) or any(s <= 0 for s in scales):
            raise ValueError(f"a cluster clock's rates must be finite and >= 0 (scales > 0), got {self}")

    def handover_s(self, device: int, nbytes: int) -> float:
        """Seconds device k's link holds a hand-over of ``nbytes`` (eq. 13, tau_0 split over two hand-overs)."""
        rate = self.d2d_bytes_per_s[device]
        return (nbytes / rate if rate > 0 else 0.0) + self.d2d_latency_s[device] / 2.0

    def uplink_s(self, nbytes: float) -> float:
        """Seconds the CU's uplink takes for ``nbytes`` at R_n (eq. 11); 0 without a rate."""
        return nbytes / self.uplink_bytes_per_s if self.uplink_bytes_per_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping) -> ClusterClock:
        return cls(
            scale=tuple(float(x) for x in data["scale"]),
            d2d_bytes_per_s=tuple(float(x) for x in data["d2d_bytes_per_s"]),
            d2d_latency_s=tuple(float(x) for x in data["d2d_latency_s"]),
            uplink_bytes_per_s=float(data.get("uplink_bytes_per_s", 0.0)),
            host_flops=float(data.get("host_flops", 0.0)),
            cu_scale=float(data.get("cu_scale", 1.0)),
        )


class StepCalls(NamedTuple):
    """What one step measured for the virtual clock: ``stages``, per stage in pipeline order (device k, its
    calls); ``cu_cpu_s``, the CU's embedding forwards, backwards and update (CPU seconds of its thread);
    ``head_cpu_s``, a head the CU trains itself (0 for the server's decoder, which the server counts)."""

    stages: tuple[tuple[int, tuple[CallCpu, ...]], ...]
    cu_cpu_s: float = 0.0
    head_cpu_s: float = 0.0


@dataclass(frozen=True)
class VirtualSteps:
    """Virtual seconds of a cluster's steps by part: ``compute`` (the devices' critical path with hand-overs
    taking no time, and the updates), ``d2d`` (what the hand-overs add to that path), ``cu`` (embedding and a
    CU-trained head), ``uplink`` (z^enc at R_n); ``device`` (per device k: its scaled CPU seconds, its busy time
    whatever the path) and ``steps``."""

    compute: float = 0.0
    d2d: float = 0.0
    cu: float = 0.0
    uplink: float = 0.0
    device: tuple[float, ...] = ()
    steps: int = 0

    @property
    def total(self) -> float:
        return self.compute + self.d2d + self.cu + self.uplink

    def __add__(self, other: VirtualSteps) -> VirtualSteps:
        width = max(len(self.device), len(other.device))
        mine, theirs = _padded(self.device, width), _padded(other.device, width)
        return VirtualSteps(
            self.compute + other.compute,
            self.d2d + other.d2d,
            self.cu + other.cu,
            self.uplink + other.uplink,
            tuple(a + b for a, b in zip(mine, theirs)),
            self.steps + other.steps,
        )


def _padded(values: tuple[float, ...], width: int) -> tuple[float, ...]:
    return (*values, *([0.0] * (width - len(values))))


def _durations(stages, clock: ClusterClock, with_links: bool):
    """Per stage {(kind, i): seconds} (each call scaled, plus its outgoing hand-over when ``with_links``) and the
    stages' scaled update seconds."""
    S = len(stages)
    calls: list[dict[tuple[str, int], float]] = []
    updates: list[float] = []
    for s, (k, table) in enumerate(stages):
        times: dict[tuple[str, int], float] = {}
        update = 0.0
        for call in table:
            seconds = call.cpu_s * clock.scale[k]
            if call.kind == "U":
                update += seconds
                continue
            hands_on = (call.kind == "F" and s < S - 1) or (call.kind == "B" and s > 0)
            if with_links and hands_on:
                seconds += clock.handover_s(k, call.bytes_out)
            times[(call.kind, call.micro_batch)] = times.get((call.kind, call.micro_batch), 0.0) + seconds
        calls.append(times)
        updates.append(update)
    return calls, updates


def _path(stages, clock: ClusterClock, schedule: str, with_links: bool) -> float:
    calls, updates = _durations(stages, clock, with_links)
    m = 1 + max((i for times in calls for (_, i) in times), default=-1)
    if m == 0:
        return max(updates, default=0.0)
    forward = [[calls[s].get(("F", i), 0.0) for s in range(len(stages))] for i in range(m)]
    backward = [[calls[s].get(("B", i), 0.0) for s in range(len(stages))] for i in range(m)]
    # each stage updates right behind its last backward (pipeline/gpipe.py): the step ends with the latest
    return stage_order_critical_path_s(forward, backward, schedule, tail_s=updates)


def virtual_step(
    step: StepCalls, clock: ClusterClock, schedule: str = "gpipe", head_bytes: int | None = None
) -> VirtualSteps:
    """One step's virtual seconds by part (:class:`VirtualSteps`). ``head_bytes``: the z^enc bytes sent to the head
    (default: the last stage's forward outputs); 0 for a head on the CU (nothing crosses the uplink)."""
    stages = step.stages
    if not stages:
        return VirtualSteps(cu=step.cu_cpu_s * clock.cu_scale, steps=1)
    compute = _path(stages, clock, schedule, with_links=False)
    with_links = _path(stages, clock, schedule, with_links=True)
    last = stages[-1][0]
    if head_bytes is None:
        head_bytes = sum(c.bytes_out for c in stages[-1][1] if c.kind == "F")
    device = [0.0] * len(clock.scale)
    for k, table in stages:
        device[k] += sum(c.cpu_s for c in table) * clock.scale[k]
    head = step.head_cpu_s * clock.scale[last]  # a CU-trained head runs with the last segment (VanillaFL: on it)
    device[last] += head
    return VirtualSteps(
        compute=compute + head,
        d2d=with_links - compute,
        cu=step.cu_cpu_s * clock.cu_scale,
        uplink=clock.uplink_s(head_bytes),
        device=tuple(device),
        steps=1,
    )


def virtual_steps(
    steps: Sequence[StepCalls], clock: ClusterClock, schedule: str = "gpipe", head_on_server: bool = True
) -> VirtualSteps:
    """The steps one after another: their parts summed."""
    total = VirtualSteps(device=(0.0,) * len(clock.scale))
    for step in steps:
        total = total + virtual_step(step, clock, schedule, None if head_on_server else 0)
    return total


def virtual_users(users: Sequence[Sequence[StepCalls]], clock: ClusterClock, schedule: str = "gpipe") -> VirtualSteps:
    """D data users (VanillaFL read the paper's way) train at once, each on its own device with a CU-trained head:
    the cluster's time is the slowest user's (its parts), the devices' busy time each user's own."""
    runs = [virtual_steps(steps, clock, schedule, head_on_server=False) for steps in users]
    if not runs:
        return VirtualSteps(device=(0.0,) * len(clock.scale))
    slowest = max(runs, key=lambda run: run.total)
    device = tuple(sum(run.device[k] for run in runs) for k in range(len(clock.scale)))
    return VirtualSteps(slowest.compute, slowest.d2d, slowest.cu, slowest.uplink, device, slowest.steps)
