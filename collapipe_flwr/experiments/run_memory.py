"""The memory of a whole run: the summed PSS of every process it started, sampled every second (issue 64).

A run is many processes: the `flwr` CLI, the detached SuperLink and its SuperExec, the simulation process that
holds the ServerApp and the decoder host, Ray's GCS / raylet / dashboard and idle workers, one ClientApp worker
per CU and one actor per device. Each imports torch, and they share pages (the torch library, Ray's object store,
the data plane's shared memory), so their RSS figures cannot be added up. PSS (proportional set size) can: a page
shared by n processes counts 1/n in each, and the sum over all processes is the memory the run holds
(``/proc/<pid>/smaps_rollup``, read through ``psutil.Process.memory_full_info``).

:class:`RunMemorySampler` is a thread that, every ``every_s`` seconds, lists the run's processes (a callable
given to it: the launcher's, :func:`run_pids`), reads each one's PSS and keeps, per sample, the sum over all of
them and the sum per kind of process (:func:`kind_of`, from the command line). :meth:`RunMemorySampler.stop`
returns :class:`RunMemory`: the peak of the total, the peak of each kind's sum (each kind at its own peak, so
they do not add up to the total), and every process's own peak PSS. ``device_shares`` then sets each device
actor's peak beside the bytes the memory model charges its segment (C7, ``device-peak-bytes`` in rounds.jsonl):
what the process holds above its segment's share of the model.

A process that ends between the listing and the read is skipped; a sample is never an error. Reading PSS makes the
kernel walk every page a process maps: about 17 ms of CPU per GiB held (306 ms for 18 processes holding 9.9 GiB,
measured here), so the interval stretches to keep sampling under :data:`CPU_SHARE` of one core (a 4 GiB run:
about one sample every 2.3 s). ``memory.json`` keeps the number of samples beside the run's wall time.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from collapipe_flwr.atomic_files import write_atomic
from collapipe_flwr.errors import CollaPipeError

MEMORY_FILE = "memory.json"
CPU_SHARE = 0.03  # at most this share of one core goes to sampling: a longer interval when a sample costs more
MIB = 2**20
# (kind, text in the command line that marks it), first match wins: Ray names an actor's process
# "ray::<Class>" (and "ray::<Class>.<method>" while it runs one), an unused worker "ray::IDLE"
KINDS: tuple[tuple[str, str], ...] = (
    ("device actors", "ray::StageActor"),
    ("CU workers", "ray::ClientAppActor"),
    ("Ray idle workers", "ray::IDLE"),
    ("Ray (GCS, raylet, agents)", "ray::DashboardAgent"),
    ("Ray (GCS, raylet, agents)", "ray::RuntimeEnvAgent"),
    ("Ray (GCS, raylet, agents)", "/ray/"),
    ("server (ServerApp, decoder)", "flwr-simulation"),
    ("server (ServerApp, decoder)", "flwr-serverapp"),
    ("Flower (CLI, SuperLink, SuperExec)", "flwr"),
    ("Flower (CLI, SuperLink, SuperExec)", "flower-"),
)
OTHER = "other"


def kind_of(cmdline: str) -> str:
    """The kind of process a command line names (:data:`KINDS`); :data:`OTHER` when none matches."""
    for kind, mark in KINDS:
        if mark in cmdline:
            return kind
    return OTHER


@dataclass
class ProcessPeak:
    """One process of the run: its kind, the start of its command line and its peak PSS."""

    kind: str
    command: str
    peak_pss_bytes: int


@dataclass
class RunMemory:
    """What :class:`RunMemorySampler` saw: the peak of the summed PSS, each kind's peak sum, each process's peak."""

    every_s: float
    samples: int = 0
    started: float = field(default_factory=time.monotonic)
    # per sample: seconds since the start, the summed PSS and each kind's sum (MiB): when the peak came, and of what
    timeline: list[tuple[float, float, dict[str, float]]] = field(default_factory=list)
    peak_total_bytes: int = 0
    peak_by_kind_bytes: dict[str, int] = field(default_factory=dict)
    processes: dict[int, ProcessPeak] = field(default_factory=dict)

    def add_sample(self, readings: Iterable[tuple[int, str, int]]) -> None:
        """Fold one sample, ``(pid, command line, PSS bytes)`` per process, into the peaks."""
        total, by_kind = 0, dict[str, int]()
        for pid, cmdline, pss in readings:
            kind = kind_of(cmdline)
            total += pss
            by_kind[kind] = by_kind.get(kind, 0) + pss
            seen = self.processes.get(pid)
            if seen is None or seen.kind != kind:  # a Ray worker turns from IDLE into an actor: its kind now
                self.processes[pid] = ProcessPeak(kind, cmdline[:120], max(pss, seen.peak_pss_bytes if seen else 0))
            else:
                seen.peak_pss_bytes = max(seen.peak_pss_bytes, pss)
        self.samples += 1
        at = round(time.monotonic() - self.started, 1)
        self.timeline.append((at, round(total / MIB, 1), {k: round(v / MIB, 1) for k, v in sorted(by_kind.items())}))
        self.peak_total_bytes = max(self.peak_total_bytes, total)
        for kind, value in by_kind.items():
            self.peak_by_kind_bytes[kind] = max(self.peak_by_kind_bytes.get(kind, 0), value)

    def to_json(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "samples": self.samples,
            "timeline_mib": [list(entry) for entry in self.timeline],
            "peak_total_bytes": self.peak_total_bytes,
            "peak_by_kind_bytes": dict(sorted(self.peak_by_kind_bytes.items())),
            "processes": {str(pid): asdict(p) for pid, p in sorted(self.processes.items())},
        }

    def summary_line(self) -> str:
        """One line: the peak and each kind's peak, in GiB / MiB."""
        kinds = ", ".join(
            f"{kind} {value / MIB:.0f} MiB"
            for kind, value in sorted(self.peak_by_kind_bytes.items(), key=lambda kv: -kv[1])
        )
        return f"peak memory {self.peak_total_bytes / 2**30:.2f} GiB summed PSS of the run's processes ({kinds})"


def read_pss(pids: Iterable[int]) -> list[tuple[int, str, int]]:
    """``(pid, command line, PSS bytes)`` of each pid still running; a process gone or hidden is left out."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            cmdline = " ".join(proc.cmdline())
            out.append((pid, cmdline, int(proc.memory_full_info().pss)))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return out


def run_pids(cli_pid: int, flwr_home: Path, scratch: Path) -> list[int]:
    """The processes of one launched run: the `flwr` CLI and all below it, the detached SuperLink (its command line
    names the run's private FLWR_HOME) and all below it, and Ray's daemons (they name the private temp folder).
    One pass over the process table (this runs every sample)."""
    home, temp = str(flwr_home), str(scratch) + os.sep
    children: dict[int, list[int]] = {}
    roots, found = [cli_pid], set()
    for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
        pid, cmdline = proc.info["pid"], " ".join(proc.info.get("cmdline") or [])
        children.setdefault(proc.info["ppid"], []).append(pid)
        if home in cmdline:
            roots.append(pid)
        elif temp in cmdline:
            found.add(pid)
    todo, below = list(roots), set(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in below:
                below.add(child)
                todo.append(child)
    found |= below
    found.discard(os.getpid())
    return sorted(found)


class RunMemorySampler(threading.Thread):
    """Samples the summed PSS of ``list_pids()``'s processes every ``every_s`` seconds until :meth:`stop`."""

    def __init__(self, list_pids: Callable[[], list[int]], every_s: float = 1.0) -> None:
        super().__init__(name="run-memory", daemon=True)
        self.list_pids = list_pids
        self.memory = RunMemory(every_s)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            cost = self.sample()
            self._stop_event.wait(max(self.memory.every_s, cost / CPU_SHARE))

    def sample(self) -> float:
        """Take one sample; return the CPU seconds it took this thread (the kernel's page walk included)."""
        start = time.thread_time()
        try:
            self.memory.add_sample(read_pss(self.list_pids()))
        except (psutil.Error, OSError):  # the process table moved under the listing: the next sample
            pass
        return time.thread_time() - start

    def stop(self) -> RunMemory:
        """Stop sampling (after the sample under way), take a last sample of what is still running (the run's
        processes are stopped after this) and return what was seen."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=30.0)
        self.sample()
        return self.memory


def _round_lines(run_dir: Path) -> list[dict[str, Any]]:
    """The rounds of ``run_dir``'s rounds.jsonl (or .jsonl.gz); [] when there is none."""
    for name, opener in (("rounds.jsonl", open), ("rounds.jsonl.gz", gzip.open)):
        path = run_dir / name
        if path.is_file():
            with opener(path, "rt", encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip().startswith("{")]
    return []


def device_c7_bytes(run_dir: Path) -> dict[int, float]:
    """Per device actor pid: the largest bytes the memory model charged its segment in any round (C7's
    ``device-peak-bytes`` of the device k that pid was, ``device-pid-devices``)."""
    charged: dict[int, float] = {}
    for record in _round_lines(run_dir):
        for report in (record.get("clients") or {}).values():
            pids, devices = report.get("device-pids") or [], report.get("device-pid-devices") or []
            peaks = report.get("device-peak-bytes") or []
            for pid, k in zip(pids, devices):
                if 0 <= int(k) < len(peaks):
                    charged[int(pid)] = max(charged.get(int(pid), 0.0), float(peaks[int(k)]))
    return charged


def device_shares(memory: RunMemory, run_dir: Path) -> dict[str, dict[str, float]]:
    """Per device actor seen by the sampler: its peak PSS, its segment's C7 bytes and the excess (MiB)."""
    charged = device_c7_bytes(run_dir)
    out = {}
    for pid, peak in sorted(memory.processes.items()):
        if peak.kind == KINDS[0][0] and pid in charged:
            pss, c7 = peak.peak_pss_bytes / MIB, charged[pid] / MIB
            out[str(pid)] = {"peak_pss_mib": round(pss, 1), "c7_mib": round(c7, 1), "above_c7_mib": round(pss - c7, 1)}
    return out


def write_run_memory(memory: RunMemory, job_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Write ``<job_dir>/memory.json`` (the peaks, every process's, the device actors' shares against C7) and
    return status.json's memory fields; a disk error loses only this file (the run's own records are whole)."""
    content = {**memory.to_json(), "device_shares": device_shares(memory, run_dir)}
    with contextlib.suppress(CollaPipeError):
        write_atomic(job_dir / MEMORY_FILE, json.dumps(content, indent=2, sort_keys=True))
    return {"peak_pss_bytes": memory.peak_total_bytes, "memory": memory.summary_line()}
