"""An OS-enforced CPU share for one process (all its threads, and the children it forks later): a cgroup.

A device of the emulated edge testbed is a process on a shared box; to give it the speed of a slower device
it runs under a CFS bandwidth quota: in every scheduling period of ``period_us`` microseconds the kernel
lets its threads run for at most ``cores * period_us`` microseconds in total, then throttles them until the
next period. ``cores`` may be below one (0.25 = a quarter of one core) or above (2.0 = two cores' worth).

The quota lives in the ``cpu`` controller of the hierarchy :func:`.cgroup_hierarchy.detect` picks (cgroup v1
``cpu.cfs_period_us`` + ``cpu.cfs_quota_us``, or v2 ``cpu.max``; see :mod:`.cgroup_hierarchy`).

Each quota is a child ``collapipe/<name>-<creator pid>-<random hex>`` of the hierarchy's root, so two runs
(or two devices of one run) never collide; :meth:`CpuQuota.remove` moves the processes back to the cgroup
they came from, removes the child and then the ``collapipe`` parent once it is empty.

Written by hand: no library kept in this project (psutil included) creates cgroups or sets CFS quotas, and
the few file writes below are the whole interface (Documentation/admin-guide/cgroup-v1/cgroups.rst and
cgroup-v2.rst of the kernel). Nothing here throttles silently or runs unthrottled silently: when quotas
cannot be used, :meth:`CpuQuota.apply` raises :class:`TestbedError` with the reason in one line.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from pathlib import Path

from collapipe_flwr.errors import TestbedError
from collapipe_flwr.testbed.cgroup_hierarchy import (
    Hierarchy,
    available,
    cgroup_path_of,
    detect,
    empty_and_remove,
    enable_controller,
    procs_of,
    read_value,
    write_value,
)
from collapipe_flwr.testbed.removal import RemovedOnExit

PARENT = "collapipe"
DEFAULT_PERIOD_US = 100_000  # the kernel's default CFS period (100 ms)
MIN_PERIOD_US = 1_000  # the kernel refuses periods below 1 ms and above 1 s
MAX_PERIOD_US = 1_000_000
MIN_QUOTA_US = 1_000  # and quotas below 1 ms
FIX = "run as root on Linux with the cgroup cpu controller, or set testbed.cpu_quota=false"
_NAME = re.compile(r"[A-Za-z0-9_.]([A-Za-z0-9_.-]{0,47})")


def quota_us(cores: float, period_us: int = DEFAULT_PERIOD_US) -> int:
    """The CFS quota in microseconds per period for ``cores`` cores' worth of CPU time; checks both bounds."""
    if isinstance(period_us, bool) or not isinstance(period_us, int) or not MIN_PERIOD_US <= period_us <= MAX_PERIOD_US:
        raise TestbedError(
            f"cpu quota period {period_us!r} us must be an integer in [{MIN_PERIOD_US}, {MAX_PERIOD_US}]"
        )
    if isinstance(cores, bool) or not isinstance(cores, int | float) or not math.isfinite(cores) or cores <= 0:
        raise TestbedError(f"cpu quota cores={cores!r} must be a finite number > 0 (e.g. 0.25 of one core)")
    quota = round(cores * period_us)
    if quota < MIN_QUOTA_US:
        raise TestbedError(
            f"cpu quota cores={cores} gives {quota} us per {period_us} us period, below the kernel's "
            f"{MIN_QUOTA_US} us minimum; use cores >= {MIN_QUOTA_US / period_us:g} or a longer period"
        )
    return quota


def parse_cores(text: str, version: int, period_text: str = "") -> float:
    """Cores from a cgroup's own files: v2 ``cpu.max`` text, or v1 ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us``.

    Unlimited (``max`` / ``-1``) is ``math.inf``.
    """
    if version == 2:
        quota, period = text.split()
    else:
        quota, period = text.strip(), period_text.strip()
    if quota in ("max", "-1"):
        return math.inf
    return int(quota) / int(period)


def _check_pid(pid: int) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise TestbedError(f"cpu quota pid={pid!r} must be a positive integer (a process id)")
    return pid


class CpuQuota(RemovedOnExit):
    """A child cgroup that holds a CFS quota and the processes put under it; see the module docstring.

    Make one with :meth:`apply`; use it as a context manager or call :meth:`remove` (idempotent).
    """

    def __init__(self, hierarchy: Hierarchy, path: Path, origin: Path, period_us: int, cores: float) -> None:
        self.hierarchy = hierarchy
        self.path = path  # the child cgroup's directory
        self.origin = origin  # where the first process came from; remove() moves the processes back there
        self.period_us = period_us
        self.cores = cores  # as requested; read_back() reads what the kernel holds
        self._removed = False

    # ------------------------------------------------------------------------------------ creation
    @classmethod
    def apply(
        cls,
        pid: int,
        cores: float,
        name: str,
        *,
        period_us: int = DEFAULT_PERIOD_US,
        hierarchy: Hierarchy | None = None,
    ) -> CpuQuota:
        """Put process ``pid`` (all its threads) under a quota of ``cores`` cores in a new cgroup named after ``name``.

        ``hierarchy`` defaults to :func:`detect`'s after :func:`available` passes; raises TestbedError with
        one line when quotas cannot be used, the arguments are out of range, or the kernel refuses a write.
        """
        _check_pid(pid)
        quota = quota_us(cores, period_us)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TestbedError(
                f"cpu quota name={name!r} must be 1-48 characters of letters, digits, '_', '.', '-' "
                "(not starting with '-')"
            )
        if hierarchy is None:
            reason = available()
            if reason is not None:
                raise TestbedError(f"runtime.testbed needs cgroup cpu quotas: {reason}; {FIX}")
            found = detect()
            assert isinstance(found, Hierarchy)  # available() returned None
            hierarchy = found
        origin = hierarchy.dir_of(cgroup_path_of(pid, hierarchy)) or hierarchy.mount
        path = cls._make_child(hierarchy, f"{name}-{os.getpid()}-{secrets.token_hex(4)}")
        quota_obj = cls(hierarchy, path, origin, period_us, float(cores))
        try:
            quota_obj._write_quota(quota)
            quota_obj.add(pid)
        except BaseException:
            quota_obj.remove()
            raise
        return quota_obj

    @staticmethod
    def _make_child(hierarchy: Hierarchy, child: str) -> Path:
        """mkdir ``collapipe/<child>`` (v2: with ``+cpu`` enabled on the way); retried when a concurrent
        :meth:`remove` of another quota rmdirs the shared parent in between."""
        parent = hierarchy.mount / PARENT
        path = parent / child
        for attempt in range(5):
            try:
                if hierarchy.version == 2:
                    enable_controller(hierarchy.mount)
                parent.mkdir(exist_ok=True)
                if hierarchy.version == 2:
                    enable_controller(parent)
                path.mkdir()
                return path
            except FileNotFoundError:
                if attempt == 4:
                    raise TestbedError(f"cannot create cgroup {path}: its parent keeps vanishing; {FIX}") from None
            except OSError as err:
                try:
                    parent.rmdir()  # when this call created it and it is still empty
                except OSError:
                    pass
                raise TestbedError(f"cannot create cgroup {path}: {err.strerror}; {FIX}") from None
        raise AssertionError("unreachable")

    def _write_quota(self, quota: int) -> None:
        try:
            if self.hierarchy.version == 2:
                write_value(self.path / "cpu.max", f"{quota} {self.period_us}")
            else:
                write_value(self.path / "cpu.cfs_period_us", str(self.period_us))
                write_value(self.path / "cpu.cfs_quota_us", str(quota))
        except OSError as err:
            raise TestbedError(
                f"the kernel refused cpu quota {quota} us per {self.period_us} us in {self.path}: {err.strerror} "
                "(a parent cgroup with a smaller quota?)"
            ) from None

    # ------------------------------------------------------------------------------------ use
    def add(self, pid: int) -> None:
        """Move process ``pid`` (its whole thread group) into this quota's cgroup, e.g. a second worker."""
        _check_pid(pid)
        self._check_live()
        try:
            write_value(self.path / "cgroup.procs", str(pid))
        except ProcessLookupError:
            raise TestbedError(
                f"no process with pid {pid} (it exited?); start it before applying its cpu quota"
            ) from None
        except OSError as err:
            raise TestbedError(f"cannot move pid {pid} into cgroup {self.path}: {err.strerror}; {FIX}") from None

    def set_cores(self, cores: float) -> None:
        """Change the quota of the running processes to ``cores`` cores (the kernel applies it at once)."""
        self._check_live()
        self._write_quota(quota_us(cores, self.period_us))
        self.cores = float(cores)

    def read_back(self) -> float:
        """Cores as the kernel holds them in the cgroup's files (``math.inf`` = unlimited)."""
        self._check_live()
        if self.hierarchy.version == 2:
            return parse_cores(read_value(self.path / "cpu.max"), 2)
        return parse_cores(read_value(self.path / "cpu.cfs_quota_us"), 1, read_value(self.path / "cpu.cfs_period_us"))

    def pids(self) -> list[int]:
        """The processes (thread-group ids) in the cgroup now, from its ``cgroup.procs``; [] once removed."""
        return procs_of(self.path)

    def throttled(self) -> tuple[int, float]:
        """``(periods throttled, seconds throttled)`` from the cgroup's ``cpu.stat``: proof the quota bites."""
        self._check_live()
        stat = dict(line.split() for line in read_value(self.path / "cpu.stat").splitlines() if len(line.split()) == 2)
        if self.hierarchy.version == 2:
            return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_usec", 0)) / 1e6
        return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_time", 0)) / 1e9

    def _check_live(self) -> None:
        if self._removed:
            raise TestbedError(f"cpu quota {self.path.name} was removed; apply a new one")

    # ------------------------------------------------------------------------------------ clean-up
    def remove(self) -> None:
        """Move the processes back where the first one came from, rmdir the cgroup and the empty parent.

        Idempotent. Processes that exited meanwhile are skipped; when the original cgroup is gone (or, in
        v2, no longer a leaf) they go to the hierarchy's root. Raises TestbedError only when the cgroup
        still holds processes after repeated moves (something keeps adding them).
        """
        if self._removed:
            return
        empty_and_remove(self.path, (self.origin, self.hierarchy.mount))
        self._removed = True

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"pids={self.pids()}"
        return f"CpuQuota(v{self.hierarchy.version} {self.path}, cores={self.cores:g}, {state})"


def remove_stale(hierarchy: Hierarchy | None = None) -> list[Path]:
    """Remove the ``collapipe/*`` cgroups left by runs that died before :meth:`CpuQuota.remove` (and the memory
    cgroups of device processes the kernel killed, ``memory_limit.py``).

    A child is stale when the pid in its name (``<name>-<creator pid>-<hex>``) is no longer running and it
    holds no process; returns the directories removed (then the parent too when empty). Cgroups of live
    runs are never touched. Without ``hierarchy``, the cpu and the memory controllers' hierarchies are swept
    (those usable here).
    """
    if hierarchy is not None:
        return _sweep(hierarchy)
    removed: list[Path] = []
    mounts: set[Path] = set()
    for controller in ("cpu", "memory"):
        found = detect(controller=controller)
        if isinstance(found, str) or available(controller) is not None or found.mount in mounts:
            continue
        mounts.add(found.mount)
        removed += _sweep(found)
    return removed


def _sweep(hierarchy: Hierarchy) -> list[Path]:
    parent = hierarchy.mount / PARENT
    removed = []
    for child in sorted(parent.glob("*")) if parent.is_dir() else []:
        parts = child.name.rsplit("-", 2)
        if not child.is_dir() or len(parts) != 3 or not parts[1].isdigit():
            continue
        if Path(f"/proc/{parts[1]}").exists():
            continue  # its creator still runs (or the pid was reused: left for a later sweep)
        try:
            child.rmdir()  # refused (EBUSY) while processes are in it
            removed.append(child)
        except OSError:
            pass
    try:
        parent.rmdir()
    except OSError:
        pass
    return removed
