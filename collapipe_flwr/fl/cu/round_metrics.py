"""The metrics of a CU's reply to a train instruction (the keys the server checks,
fl/server/aggregation/reply_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from collapipe_flwr.fl.cu.step_log import StepLog
from collapipe_flwr.pipeline.device_process import DeviceProcess
from collapipe_flwr.pipeline.virtual_clock import ClusterClock, virtual_steps, virtual_users


@dataclass(frozen=True)
class RoundPreparation:
    """What loading the round's weights did on the CU: the pipeline of the last round reused, blocks moved between
    devices (a new partition delta_k), the optimizer moments restored (metrics ``pipeline-reused``,
    ``blocks-moved``, ``optimizer-restored``, each 0 or 1)."""

    pipeline_reused: bool
    blocks_moved: bool
    optimizer_restored: bool

    def metrics(self) -> dict[str, int]:
        return {
            "pipeline-reused": int(self.pipeline_reused),
            "blocks-moved": int(self.blocks_moved),
            "optimizer-restored": int(self.optimizer_restored),
        }


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

    def seconds(self, end: float) -> dict[str, float]:
        return {
            "seconds-setup": self.setup - self.start,
            "seconds-profile": self.measured - self.setup,
            "seconds-build-pipeline": self.built - self.measured,
            "seconds-upload": self.upload_s,
            "seconds-finish": self.finish_s,
            "seconds-train": self.trained - self.built,
            "seconds-total": end - self.start,
        }


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
    final_delta: list[int] = field(default_factory=list)
    final_m: int = 0
    # what the OS measured per device k this round (pipeline/process_memory.py; 0 for a device left idle or in
    # the CU's own process): the figure reported (the cgroup's where there is one), both sources, the limit
    measured_peak_bytes: list[float] = field(default_factory=list)
    rss_peak_bytes: list[float] = field(default_factory=list)
    cgroup_peak_bytes: list[float] = field(default_factory=list)
    limit_bytes: list[float] = field(default_factory=list)

    def metrics(self, device_compute: list[float]) -> dict:
        out = {
            "device-peak-bytes": self.peak_bytes,
            "device-measured-peak-bytes": self.measured_peak_bytes,
            "device-rss-peak-bytes": self.rss_peak_bytes,
            "device-cgroup-peak-bytes": self.cgroup_peak_bytes,
            "device-memory-limit-bytes": self.limit_bytes,
            "device-compute-seconds": device_compute,
            "device-pids": self.pids,
            "device-netns": self.netns,
        }
        if self.lost:
            out.update(
                {
                    "lost-devices": list(self.lost),
                    # Flower's metrics hold numbers only: the lost devices the kernel killed for memory (C7)
                    "lost-for-memory": [k for k, why in zip(self.lost, self.lost_reasons) if why == "memory"],
                    "replanned-delta": self.final_delta,
                    "replanned-m": self.final_m,
                }
            )
        return out


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
    )


def virtual_metrics(
    steps: StepLog, clock: ClusterClock | None, schedule: str, head_on_server: bool, setup_s: float, upload_bytes: int
) -> dict:
    """The round on the virtual clock (``pipeline/virtual_clock.py``), by part, when the server sent its rates:
    the devices' critical path (``virtual-compute-s``), what the D2D hand-overs add (``virtual-d2d-s``), the CU's
    embedding (``virtual-cu-s``), z^enc and the reply's weights at R_n (``virtual-uplink-s``, eq. 11), the round's
    set-up and profiling as measured (``virtual-setup-s``: wall seconds, not scaled), each device's busy seconds
    (``virtual-device-s``) and their sum, the cluster's round without the server's decoder
    (``virtual-cluster-s``)."""
    if clock is None:
        return {}
    if steps.user_calls:
        part = virtual_users(steps.user_calls, clock, schedule)
    else:
        part = virtual_steps(steps.calls, clock, schedule, head_on_server)
    uplink = part.uplink + clock.uplink_s(upload_bytes)
    return {
        "virtual-compute-s": part.compute,
        "virtual-d2d-s": part.d2d,
        "virtual-cu-s": part.cu,
        "virtual-uplink-s": uplink,
        "virtual-setup-s": setup_s,
        "virtual-device-s": [float(x) for x in part.device],
        "virtual-cluster-s": part.compute + part.d2d + part.cu + uplink + setup_s,
    }


def step_metrics(steps: StepLog, lr_factor_first: float) -> dict:
    """The round's loss (mean, first, last, every step's), its examples, steps and first lr factor."""
    losses = steps.losses
    return {
        "num-examples": steps.examples,
        "train-loss": sum(losses) / max(len(losses), 1),
        "train-loss-first": losses[0] if losses else float("nan"),
        "train-loss-last": losses[-1] if losses else float("nan"),
        "train-losses": [float(x) for x in losses],
        "steps": len(losses),
        "lr-factor-first": lr_factor_first,
        **{f"seconds-step-{k}": v for k, v in steps.seconds.items()},
        # data-parallel rounds: each user's steps and hand-over, one user after another here, and the CU's average
        # (the parallel round is the slowest user's hand-over and steps, then the average)
        **(
            {
                "seconds-users": [float(s) for s in steps.user_seconds],
                "seconds-users-handover": [float(s) for s in steps.user_handover_seconds],
                "seconds-users-average": float(steps.average_seconds),
            }
            if steps.user_seconds
            else {}
        ),
    }
