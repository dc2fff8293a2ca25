"""What a CU sends back for one round, typed: :class:`RoundReport`, the other half of ``TrainInstructions``.

A CU's train reply is its weights (an ``ArrayRecord``) and this report. On the wire the report is Flower's flat
``MetricRecord`` (numbers and lists of numbers under hyphenated keys, as in ``rounds.jsonl``'s ``clients``
section); :meth:`RoundReport.to_record` and :meth:`RoundReport.from_record` are its only codec, at the Flower
boundary: the CU builds a report, the server reads fields. ``from_record`` refuses, in one line naming the key,
a metric that is missing, unknown, of the wrong type or outside its range (a diverged or other-version CU), so
nothing past it checks keys.

The figures, by where they come from (paper symbols where the paper has one):
- :class:`StepFigures`: the round's local steps: examples seen (the FedAvg weight), every step's loss (their
  mean is the loss that feeds the queues Y_n, eq. 29), the first step's lr factor, seconds per GPipe phase and,
  for data-parallel rounds (VanillaFL read the paper's way), each user's.
- :class:`RoundSeconds`: the CU's wall clock by phase (set-up, profiling, pipeline build, steps, upload, its
  checkpoint).
- :class:`Preparation`: what loading the round's weights did (pipeline reused, blocks moved, moments restored).
- :class:`DeviceFigures`: per device k: memory (the model's gamma_k and what the OS measured), compute, D2D link
  and CPU seconds, the process and its network namespace.
- :class:`Replan`: the devices lost this round and the partition delta_k and m the CU finished on.
- :class:`VirtualFigures`: the cluster's round on the virtual clock by part (``pipeline/virtual_clock.py``).
- :class:`TestbedFigures`: the measured profile (phi_k f_k, gamma_k, r_k^dd, tau_0 per device; the CU's own
  step), the uplink's waits and the cores the testbed granted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from collapipe_flwr.errors import CollaPipeError

# A training loss above this is a diverged CU, not a loss to average: the tasks' cross-entropies start near
# log(vocabulary) (about 10 for 30k words) and the CRF's per-sentence loss near 100.
MAX_TRAIN_LOSS = 1e4
MAX_SECONDS = 1e9
STEP_SECONDS = "seconds-step-"  # + a GPipe phase (embed, forward, head, backward, update, total)
PROFILE_LISTS = (  # per device k, NaN where not measured (system/profile.py)
    "profile-seconds-per-sample-block",
    "profile-microbatch-s",
    "profile-memory-bytes",
    "profile-link-bytes-per-s",
    "profile-link-latency-s",
)
PROFILE_CU_STEP_S = "profile-cu-step-s"


class _Reader:
    """Typed reads of a reply's flat metrics; each read marks its key, :meth:`unread` names what is left."""

    def __init__(self, metrics: Mapping[str, Any]) -> None:
        self.metrics = metrics
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.metrics

    def number(self, key: str, low: float = 0.0, high: float = MAX_SECONDS, use: str = "") -> float:
        value = self._get(key, use)
        if not _is_number(value) or not math.isfinite(float(value)) or not low <= float(value) <= high:
            raise _bad(key, value, f"a finite number in {low:g}..{high:g}", use)
        return float(value)

    def count(self, key: str, use: str = "") -> int:
        value = self._get(key, use)
        if not _is_number(value) or not math.isfinite(float(value)) or value != int(value) or value < 0:
            raise _bad(key, value, "a count (an integer >= 0)", use)
        return int(value)

    def loss(self, key: str) -> float:
        """A loss: finite, or NaN where the round had no step (``train-loss-first`` of an empty round)."""
        value = self._get(key, "")
        if not _is_number(value) or math.isinf(float(value)):
            raise _bad(key, value, "a number", "")
        return float(value)

    def numbers(self, key: str, finite: bool = True, use: str = "") -> tuple[float, ...]:
        """A list of numbers (>= 0 and finite unless ``finite=False``: NaN for a device not measured)."""
        value = self._get(key, use)
        ok = isinstance(value, list) and all(_is_number(x) for x in value)
        if ok and finite:
            ok = all(math.isfinite(float(x)) and x >= 0 for x in value)
        if not ok:
            raise _bad(key, value, "a list of finite numbers >= 0" if finite else "a list of numbers", use)
        return tuple(float(x) for x in value)

    def counts(self, key: str) -> tuple[int, ...]:
        values = self.numbers(key)
        if not all(x == int(x) for x in values):
            raise _bad(key, list(values), "a list of counts", "")
        return tuple(int(x) for x in values)

    def unread(self) -> list[str]:
        return sorted(set(self.metrics) - self.read)

    def _get(self, key: str, use: str) -> Any:
        if key not in self.metrics:
            what = f" ({use})" if use else ""
            raise CollaPipeError(f"the reply lacks the metric {key}{what}; the CU runs another version")
        self.read.add(key)
        return self.metrics[key]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bad(key: str, value: Any, expected: str, use: str) -> CollaPipeError:
    what = f" ({use})" if use else ""
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return CollaPipeError(
        f"the reply's {key}={shown} is not {expected}{what}; the CU's training diverged or it runs another version"
    )


@dataclass(frozen=True)
class StepFigures:
    """The round's local steps: ``examples`` (the FedAvg weight), each step's ``losses``, the first step's lr
    factor, seconds per GPipe phase (summed over the steps), and a data-parallel round's per-user seconds."""

    examples: int
    losses: tuple[float, ...]
    lr_factor_first: float
    phase_seconds: Mapping[str, float]
    user_seconds: tuple[float, ...] = ()
    user_handover_seconds: tuple[float, ...] = ()
    average_seconds: float | None = None

    @property
    def count(self) -> int:
        return len(self.losses)

    @property
    def loss(self) -> float:
        """The round's training loss: the mean of its steps' (0 without steps)."""
        return sum(self.losses) / max(len(self.losses), 1)

    def to_record(self) -> dict[str, Any]:
        losses = self.losses
        out: dict[str, Any] = {
            "num-examples": self.examples,
            "train-loss": self.loss,
            "train-loss-first": losses[0] if losses else float("nan"),
            "train-loss-last": losses[-1] if losses else float("nan"),
            "train-losses": list(losses),
            "steps": len(losses),
            "lr-factor-first": self.lr_factor_first,
            **{f"{STEP_SECONDS}{k}": v for k, v in self.phase_seconds.items()},
        }
        if self.user_seconds:
            out["seconds-users"] = list(self.user_seconds)
            out["seconds-users-handover"] = list(self.user_handover_seconds)
            out["seconds-users-average"] = self.average_seconds or 0.0
        return out

    @classmethod
    def read(cls, r: _Reader) -> StepFigures:
        use = "the FedAvg weight"
        examples = r.count("num-examples", use)
        losses = r.numbers("train-losses", use="every step's training loss")
        if any(x > MAX_TRAIN_LOSS for x in losses):
            raise _bad("train-losses", list(losses), f"a list of losses <= {MAX_TRAIN_LOSS:g}", "")
        loss = r.number("train-loss", 0.0, MAX_TRAIN_LOSS, "the round's training loss and the queues Y_n (eq. 29)")
        r.loss("train-loss-first"), r.loss("train-loss-last")
        if r.count("steps") != len(losses) or not math.isclose(loss, sum(losses) / max(len(losses), 1), rel_tol=1e-9):
            raise CollaPipeError("the reply's train-loss and steps disagree with its train-losses; the CU is corrupt")
        phases = {k[len(STEP_SECONDS) :]: r.number(k) for k in r.metrics if k.startswith(STEP_SECONDS)}
        users = r.numbers("seconds-users") if r.has("seconds-users") else ()
        handover = r.numbers("seconds-users-handover") if users else ()
        average = r.number("seconds-users-average") if users else None
        lr = r.number("lr-factor-first", 0.0, 1e6)
        return cls(examples, losses, lr, phases, users, handover, average)


@dataclass(frozen=True)
class RoundSeconds:
    """The CU's wall clock of the round by phase (seconds)."""

    setup: float
    profile: float
    build_pipeline: float
    upload: float
    finish: float
    train: float
    total: float

    def to_record(self) -> dict[str, float]:
        return {f"seconds-{f.name.replace('_', '-')}": getattr(self, f.name) for f in fields(self)}

    @classmethod
    def read(cls, r: _Reader) -> RoundSeconds:
        values = {f.name: r.number(f"seconds-{f.name.replace('_', '-')}", -1.0) for f in fields(cls)}
        values["train"] = r.number("seconds-train", 0.0, 1e7, "the round's measured training time")
        return cls(**values)


@dataclass(frozen=True)
class Preparation:
    """What loading the round's weights did on the CU: the pipeline of the last round reused, blocks moved between
    devices (a new partition delta_k), the optimizer moments restored."""

    pipeline_reused: bool
    blocks_moved: bool
    optimizer_restored: bool

    def to_record(self) -> dict[str, int]:
        return {f"{f.name.replace('_', '-')}": int(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def read(cls, r: _Reader) -> Preparation:
        values = [r.count(f.name.replace("_", "-")) for f in fields(cls)]
        if any(v > 1 for v in values):
            raise CollaPipeError(f"the reply's preparation flags {values} are not 0 or 1; the CU runs another version")
        return cls(*(bool(v) for v in values))


@dataclass(frozen=True)
class DeviceFigures:
    """Per device k of the cluster: the memory the model charges (``peak_bytes``, gamma_k's terms) and what the OS
    measured (the figure reported, RSS, the cgroup's, the limit; 0 for an idle device), compute, D2D link and CPU
    seconds over the steps; of the live devices the OS pids, the device k each pid entry is, and network namespaces."""

    peak_bytes: tuple[float, ...]
    measured_peak_bytes: tuple[float, ...]
    rss_peak_bytes: tuple[float, ...]
    cgroup_peak_bytes: tuple[float, ...]
    limit_bytes: tuple[float, ...]
    compute_seconds: tuple[float, ...]
    pids: tuple[int, ...]
    netns: tuple[int, ...]
    link_seconds: tuple[float, ...]
    cpu_seconds: tuple[float, ...]
    pid_devices: tuple[int, ...] = ()  # the device k of each ``pids`` entry (a report from before it: empty)

    _KEYS = {
        "peak_bytes": "device-peak-bytes",
        "measured_peak_bytes": "device-measured-peak-bytes",
        "rss_peak_bytes": "device-rss-peak-bytes",
        "cgroup_peak_bytes": "device-cgroup-peak-bytes",
        "limit_bytes": "device-memory-limit-bytes",
        "compute_seconds": "device-compute-seconds",
        "pids": "device-pids",
        "netns": "device-netns",
        "link_seconds": "device-link-seconds",
        "cpu_seconds": "device-cpu-seconds",
        "pid_devices": "device-pid-devices",
    }

    def to_record(self) -> dict[str, list]:
        keys = {n: k for n, k in self._KEYS.items() if n != "pid_devices" or self.pid_devices}  # old reports as sent
        return {key: list(getattr(self, name)) for name, key in keys.items()}

    @classmethod
    def read(cls, r: _Reader) -> DeviceFigures:
        counted = ("pids", "netns", "pid_devices")
        floats: dict[str, Any] = {n: r.numbers(k) for n, k in cls._KEYS.items() if n not in counted}
        pid_devices = r.counts("device-pid-devices") if r.has("device-pid-devices") else ()
        return cls(**floats, pids=r.counts("device-pids"), netns=r.counts("device-netns"), pid_devices=pid_devices)


@dataclass(frozen=True)
class Replan:
    """The devices lost this round (``lost``; those the kernel killed for memory, C7: ``lost_for_memory``) and the
    partition delta_k and m the CU finished the round on."""

    lost: tuple[int, ...]
    lost_for_memory: tuple[int, ...]
    delta: tuple[int, ...]
    m: int

    def to_record(self) -> dict[str, Any]:
        return {
            "lost-devices": list(self.lost),
            "lost-for-memory": list(self.lost_for_memory),
            "replanned-delta": list(self.delta),
            "replanned-m": self.m,
        }

    @classmethod
    def read(cls, r: _Reader) -> Replan | None:
        if not r.has("lost-devices"):
            return None
        lost, memory = r.counts("lost-devices"), r.counts("lost-for-memory")
        return cls(lost, memory, r.counts("replanned-delta"), r.count("replanned-m"))


@dataclass(frozen=True)
class VirtualFigures:
    """The cluster's round on the virtual clock by part (seconds): the devices' critical path, what the D2D
    hand-overs add, the CU's embedding, z^enc and the reply at R_n (eq. 11), set-up and profiling (the CU's own
    work: the host's seconds x the clock's ``cu_scale``);
    each device's busy seconds; the cluster's round without the server's decoder (``cluster``)."""

    compute: float
    d2d: float
    cu: float
    uplink: float
    setup: float
    device: tuple[float, ...]
    cluster: float

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"virtual-{part}-s": getattr(self, part) for part in ("compute", "d2d", "cu")}
        out.update({"virtual-uplink-s": self.uplink, "virtual-setup-s": self.setup})
        return {**out, "virtual-device-s": list(self.device), "virtual-cluster-s": self.cluster}

    @classmethod
    def read(cls, r: _Reader) -> VirtualFigures | None:
        if not r.has("virtual-cluster-s"):
            return None
        use = "the round on the virtual clock"
        parts = {p: r.number(f"virtual-{p}-s", use=use) for p in ("compute", "d2d", "cu", "uplink", "setup")}
        device = r.numbers("virtual-device-s", use="the devices' busy time on the virtual clock")
        return cls(**parts, device=device, cluster=r.number("virtual-cluster-s", use=use))


@dataclass(frozen=True)
class TestbedFigures:
    """The reply's measured profile (``profile``: each of :data:`PROFILE_LISTS`, one entry per device k, NaN where
    not measured; ``cu_step_s`` the CU's own seconds per step, ``fl/messages.read_profile`` makes it a
    ``ClusterProfile``), the seconds the uplink's token bucket held z^enc, and the cores each device's cgroup
    granted (None off the testbed)."""

    profile: Mapping[str, tuple[float, ...]]
    cu_step_s: float
    uplink_wait_s: float
    cpu_cores: tuple[float, ...] | None = None

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {key: list(self.profile[key]) for key in PROFILE_LISTS}
        out[PROFILE_CU_STEP_S] = self.cu_step_s
        out["seconds-uplink-wait"] = self.uplink_wait_s
        if self.cpu_cores is not None:
            out["testbed-cpu-cores"] = list(self.cpu_cores)
        return out

    @classmethod
    def read(cls, r: _Reader) -> TestbedFigures | None:
        if not r.has(PROFILE_CU_STEP_S):
            return None
        profile = {key: r.numbers(key, finite=False) for key in PROFILE_LISTS}
        if len({len(v) for v in profile.values()}) != 1:
            raise CollaPipeError(f"the reply's profile lists {', '.join(PROFILE_LISTS)} must be lists of one length")
        cores = r.numbers("testbed-cpu-cores") if r.has("testbed-cpu-cores") else None
        return cls(profile, r.number(PROFILE_CU_STEP_S), r.number("seconds-uplink-wait"), cores)


@dataclass(frozen=True)
class RoundReport:
    """What CU n reports for round t besides its weights (module docstring); ``upload_bytes`` is what the reply's
    tensors hold (eq. 11's model term; 0 for a method without aggregation, whose weights travel back for evaluation
    only: ``carried_bytes``)."""

    steps: StepFigures
    seconds: RoundSeconds
    devices: DeviceFigures
    preparation: Preparation
    upload_bytes: int
    carried_bytes: int | None = None
    replan: Replan | None = None
    virtual: VirtualFigures | None = None
    testbed: TestbedFigures | None = None

    def to_record(self) -> dict[str, Any]:
        """The flat metrics Flower's ``MetricRecord`` carries (and ``rounds.jsonl`` keeps per CU)."""
        out = {**self.steps.to_record(), **self.seconds.to_record()}
        out.update(self.virtual.to_record() if self.virtual is not None else {})
        devices = self.devices.to_record()
        links = {key: devices.pop(key) for key in ("device-link-seconds", "device-cpu-seconds")}
        out.update(devices)
        out.update(self.replan.to_record() if self.replan is not None else {})
        out.update(links)  # where the CU has always put them: rounds.jsonl's keys keep their order
        out.update(self.preparation.to_record())
        out["upload-bytes"] = self.upload_bytes
        if self.carried_bytes is not None:
            out["carried-bytes"] = self.carried_bytes
        out.update(self.testbed.to_record() if self.testbed is not None else {})
        return out

    @classmethod
    def from_record(cls, metrics: Mapping[str, Any]) -> RoundReport:
        """The report of a reply's flat metrics; one-line :class:`CollaPipeError` naming the first metric missing,
        malformed, out of range or unknown."""
        r = _Reader(metrics)
        report = cls(
            steps=StepFigures.read(r),
            seconds=RoundSeconds.read(r),
            devices=DeviceFigures.read(r),
            preparation=Preparation.read(r),
            upload_bytes=r.count("upload-bytes"),
            carried_bytes=r.count("carried-bytes") if r.has("carried-bytes") else None,
            replan=Replan.read(r),
            virtual=VirtualFigures.read(r),
            testbed=TestbedFigures.read(r),
        )
        unknown = r.unread()
        if unknown:
            raise CollaPipeError(f"the reply carries an unknown metric {unknown[0]}; the CU runs another version")
        return report
