"""Where a step's core time goes: CPU seconds by process group."""

from __future__ import annotations

import statistics


class CpuMeter:
    """CPU seconds (user + system) spent by this process (the CU), by given groups of actor processes and by the
    rest of this process's descendants (Ray's raylet, GCS, idle workers), over the calls between :meth:`start` and
    :meth:`stop`: where a step's core time goes, beside its wall time. Read from psutil's per-process counters, so
    the figures hold whatever else the machine runs."""

    def __init__(self, groups: dict[str, set[int]]) -> None:
        self.groups = groups
        self.totals: dict[str, list[float]] = {name: [] for name in ["cu", *groups, "ray_system"]}
        self._before: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        import psutil

        me = psutil.Process()
        seconds = dict.fromkeys(self.totals, 0.0)
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:  # a worker that ended meanwhile
                continue
            group = "cu" if proc.pid == me.pid else "ray_system"
            group = next((name for name, pids in self.groups.items() if proc.pid in pids), group)
            seconds[group] += times.user + times.system
        return seconds

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> None:
        after = self._read()
        for name in self.totals:
            self.totals[name].append(after[name] - self._before[name])

    def medians(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_cpu_{name}_s": statistics.median(values) for name, values in self.totals.items()}
