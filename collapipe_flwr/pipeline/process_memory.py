"""What a device process measures of its own memory per round, and the testbed's limit on it (C7 made real).

A device actor calls :meth:`ProcessMemory.start` first thing, idle, before it holds a block. From then on two
independent figures count what it allocates for its segment (weights, gradients, optimizer state, the
activations kept for the backward, the tensors it hands on):

* the process's anonymous and shared-memory resident set (``RssAnon`` + ``RssShmem`` of ``/proc/self/status``,
  proc(5)) above its value at start, sampled after every forward and backward of a micro-batch (where a stage's
  memory peaks) and when read: the kernel keeps a peak only of the whole resident set (``VmHWM``), which also
  counts the pages of shared libraries the first kernels fault in (tens of MiB that no segment needs, and that
  the cgroup does not charge when another process already read them);
* with ``memory_cgroup`` (cgroup v1, root), the kernel's own count: the peak charge of the process's memory
  cgroup (``testbed/memory_limit.py``), which it joined at start, so only what it allocated since is charged.

The round reports the cgroup's figure where there is one, else the resident-set one (``measured_peak_bytes``),
and both apart. On the testbed the cgroup's limit is gamma_k^max (:meth:`set_limit`), and a device over it is
killed by the kernel. Linux only; elsewhere the figures are 0.
"""

from __future__ import annotations

import os
from pathlib import Path

from collapipe_flwr.testbed.memory_limit import MemoryCgroup

_STATUS = Path("/proc/self/status")
_COUNTED = ("RssAnon:", "RssShmem:")


def private_rss_bytes() -> int:
    """``RssAnon`` + ``RssShmem`` of /proc/self/status in bytes (what this process allocated, not file pages it
    maps); 0 where there is no such file."""
    total = 0
    try:
        for line in _STATUS.read_text(encoding="ascii").splitlines():
            if line.startswith(_COUNTED):
                total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class ProcessMemory:
    """A device process's memory figures since it started idle (see module docstring)."""

    def __init__(self, rss_start_bytes: int, cgroup: MemoryCgroup | None) -> None:
        self.rss_start_bytes = rss_start_bytes
        self.cgroup = cgroup
        self._rss_peak = rss_start_bytes

    @classmethod
    def start(cls, memory_cgroup: str = "") -> ProcessMemory:
        """Now, idle: the resident set to count from and, with ``memory_cgroup`` (the cgroup's name), this process
        in its own unlimited memory cgroup (TestbedError with one line where that is impossible)."""
        group = MemoryCgroup.create(os.getpid(), memory_cgroup) if memory_cgroup else None
        return cls(private_rss_bytes(), group)

    def sample(self) -> None:
        """Note the resident set now (after a micro-batch's forward or backward, where a stage peaks)."""
        self._rss_peak = max(self._rss_peak, private_rss_bytes())

    def set_limit(self, limit_bytes: float | None) -> float:
        """gamma_k^max on this process's cgroup (None: unlimited); returns the limit the kernel holds (0 = none)."""
        if self.cgroup is None:
            return 0.0
        held = self.cgroup.limit_bytes()
        page = os.sysconf("SC_PAGE_SIZE")  # the kernel keeps the limit in whole pages
        wanted = float("inf") if limit_bytes is None else float(limit_bytes) // page * page
        if held != wanted:  # the same limit every round: not rewritten (a rewrite below usage is refused)
            self.cgroup.set_limit(limit_bytes)
        limit = self.cgroup.limit_bytes()
        return 0.0 if limit == float("inf") else limit

    def peaks(self, reset: bool = True) -> dict:
        """This round's peaks (bytes): ``rss_peak_bytes`` (the sampled resident set above its value at start),
        ``cgroup_peak_bytes`` (the kernel's, 0 without a cgroup), ``measured_peak_bytes`` (the kernel's where it
        counts, else the resident-set one), ``limit_bytes`` (gamma_k^max the kernel enforces, 0 = none) and the
        cgroup's path; ``reset`` starts the next round's peaks from now."""
        self.sample()
        rss_peak = max(0, self._rss_peak - self.rss_start_bytes)
        cgroup_peak, limit, path = 0, 0.0, ""
        if self.cgroup is not None:
            cgroup_peak, path = self.cgroup.peak_bytes(), str(self.cgroup.path)
            kernel_limit = self.cgroup.limit_bytes()
            limit = 0.0 if kernel_limit == float("inf") else kernel_limit
        if reset:
            self._rss_peak = private_rss_bytes()
            if self.cgroup is not None:
                self.cgroup.reset_peak()
        return {
            "rss_peak_bytes": rss_peak,
            "cgroup_peak_bytes": cgroup_peak,
            "measured_peak_bytes": cgroup_peak if self.cgroup is not None else rss_peak,
            "limit_bytes": limit,
            "cgroup_path": path,
        }

    def remove(self) -> None:
        """Leave the memory cgroup (removed); the process goes back where it came from."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
