"""The CU's side of its round report (``fl/round_report.py``): the figures of a round put together from its clock,
its step log, its devices and the virtual clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.fl.round_report import DeviceFigures, Replan, RoundSeconds, StepFigures, VirtualFigures
from collapipe_flwr.pipeline.device_process import DeviceProcess
from collapipe_flwr.pipeline.virtual_clock import ClusterClock, virtual_steps, virtual_users


@dataclass
class RoundClock:
    """Wall-clock marks of one CU round (``time.time()``): start, weights loaded and partitioned, testbed set and
    devices measured, head built, steps done; and the seconds of the upload and of the CU's own checkpoint."""

    start: float
    setup: float = 0.0
    measured: float = 0.0
    built: float = 0.0
    trained: float = 0.0
    upload_s: float = 0.0
    finish_s: float = 0.0

    def seconds(self, end: float) -> RoundSeconds:
        return RoundSeconds(
            setup=self.setup - self.start,
            profile=self.measured - self.setup,
            build_pipeline=self.built - self.measured,
            upload=self.upload_s,
            finish=self.finish_s,
            train=self.trained - self.built,
            total=end - self.start,
        )


@dataclass
class DeviceReport:
    """Per device k of the cluster: peak bytes (0 for a device the plan left idle); of the live ones the OS pids
    and network namespaces (``device-netns``: equal values = the same host, pipeline/device_process.py); the
    devices lost this round and the partition and m the CU finished on after re-planning."""

    peak_bytes: list[float]
    pids: list[int]
    netns: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    lost_reasons: list[str] = field(default_factory=list)
    pid_devices: list[int] = field(default_factory=list)  # the device k of each ``pids`` entry
    final_delta: list[int] = field(default_factory=list)
    final_m: int = 0
    # what the OS measured per device k this round (pipeline/process_memory.py; 0 for a device left idle or in
    # the CU's own process): the figure reported (the cgroup's where there is one), both sources, the limit
    measured_peak_bytes: list[float] = field(default_factory=list)
    rss_peak_bytes: list[float] = field(default_factory=list)
    cgroup_peak_bytes: list[float] = field(default_factory=list)
    limit_bytes: list[float] = field(default_factory=list)

    def figures(self, steps: StepLog) -> DeviceFigures:
        """Per device k: memory, the step log's compute, D2D link and CPU seconds (0 where it has none), processes."""
        zeros = [0.0] * len(steps.device_compute)
        return DeviceFigures(
            peak_bytes=tuple(self.peak_bytes),
            measured_peak_bytes=tuple(self.measured_peak_bytes),
            rss_peak_bytes=tuple(self.rss_peak_bytes),
            cgroup_peak_bytes=tuple(self.cgroup_peak_bytes),
            limit_bytes=tuple(self.limit_bytes),
            compute_seconds=tuple(float(x) for x in steps.device_compute),
            pids=tuple(self.pids),
            pid_devices=tuple(self.pid_devices),
            netns=tuple(self.netns),
            # the seconds each device's D2D link held its hand-overs (eq. 13; 0 unthrottled), apart from its compute
            link_seconds=tuple(float(x) for x in (steps.device_link or zeros)),
            cpu_seconds=tuple(float(x) for x in (steps.device_cpu or zeros)),
        )

    def replan(self) -> Replan | None:
        """The devices lost this round and the partition and m the CU finished on (None: none was lost)."""
        if not self.lost:
            return None
        memory = tuple(k for k, why in zip(self.lost, self.lost_reasons) if why == "memory")  # killed for C7
        return Replan(tuple(self.lost), memory, tuple(self.final_delta), self.final_m)


def device_report(memory: list[dict], processes: dict[int, DeviceProcess], num_devices: int) -> DeviceReport:
    """The pipeline's memory report and device processes as one entry per device k."""
    figures = {
        key: [0.0] * num_devices
        for key in ("peak_bytes", "measured_peak_bytes", "rss_peak_bytes", "cgroup_peak_bytes", "limit_bytes")
    }
    for report in memory:
        for key, values in figures.items():
            values[int(report["device"])] = float(report.get(key, 0.0) or 0.0)
    live = sorted(processes)
    return DeviceReport(
        figures["peak_bytes"],
        [processes[k].pid for k in live],
        [processes[k].netns for k in live],
        measured_peak_bytes=figures["measured_peak_bytes"],
        rss_peak_bytes=figures["rss_peak_bytes"],
        cgroup_peak_bytes=figures["cgroup_peak_bytes"],
        limit_bytes=figures["limit_bytes"],
        pid_devices=live,
    )


def virtual_figures(
    steps: StepLog, clock: ClusterClock | None, schedule: str, head_on_server: bool, setup_s: float, upload_bytes: int
) -> VirtualFigures | None:
    """The round on the virtual clock (``pipeline/virtual_clock.py``), by part, when the server sent its rates
    (None when it did not): the devices' critical path, what the D2D hand-overs add, the CU's embedding, z^enc and
    the reply's weights at R_n (eq. 11), the round's set-up and profiling (wall seconds of the CU's host, x the
    clock's ``cu_scale``: the CU's speed against the host's), each device's busy seconds, the cluster's round without
    the server's decoder."""
    if clock is None:
        return None
    setup_s = setup_s * clock.cu_scale
    if steps.user_calls:
        part = virtual_users(steps.user_calls, clock, schedule)
    else:
        part = virtual_steps(steps.calls, clock, schedule, head_on_server)
    uplink = part.uplink + clock.uplink_s(upload_bytes)
    return VirtualFigures(
        compute=part.compute,
        d2d=part.d2d,
        cu=part.cu,
        uplink=uplink,
        setup=setup_s,
        device=tuple(float(x) for x in part.device),
        cluster=part.compute + part.d2d + part.cu + uplink + setup_s,
    )


def step_figures(steps: StepLog, lr_factor_first: float) -> StepFigures:
    """The round's steps: examples, every step's loss, the first lr factor, seconds per phase and (data-parallel
    rounds) each user's steps and hand-over, one user after another here, and the CU's average (the parallel round
    is the slowest user's hand-over and steps, then the average)."""
    return StepFigures(
        examples=int(steps.examples),
        losses=tuple(float(x) for x in steps.losses),
        lr_factor_first=float(lr_factor_first),
        phase_seconds=dict(steps.seconds),
        user_seconds=tuple(float(s) for s in steps.user_seconds),
        user_handover_seconds=tuple(float(s) for s in steps.user_handover_seconds),
        average_seconds=float(steps.average_seconds) if steps.user_seconds else None,
    )
