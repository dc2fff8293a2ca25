"""An OS-enforced memory budget for one process, and the kernel's own account of what it used: a memory cgroup.

Constraint C7 (delta_k gamma_0 <= gamma_k^max) is a number in the planner; on the emulated testbed the kernel
makes it real. A device process joins its own child cgroup of the ``memory`` controller when it starts, idle,
before it holds any block. The kernel charges a page to the cgroup of the process that first touches it and
does not move earlier charges (``memory.move_charge_at_immigrate`` is left at 0), so what the cgroup counts is
what the device allocated since it joined: its segment's weights, gradients and optimizer state, the
activations it keeps for the backward, the tensors it hands on. The interpreter, torch and Ray it loaded before
stay charged where they were. That is the quantity C7 models, so the limit is gamma_k^max itself:

* ``memory.limit_in_bytes`` = gamma_k^max: a device that needs more is killed by the kernel's OOM killer
  (swap is turned off for the cgroup, ``memory.swappiness`` = 0, so it cannot page out instead);
* ``memory.max_usage_in_bytes``: the peak charge since the last reset (:meth:`MemoryCgroup.reset_peak` writes 0),
  read per round;
* ``memory.oom_control``'s ``oom_kill`` counter: how many processes the kernel killed in the cgroup, read after a
  device died to tell a memory failure from any other (:func:`oom_kills_at`, by path, since the process is gone).

Only cgroup v1's memory controller is used (Documentation/admin-guide/cgroup-v1/memory.rst). cgroup v2 puts a
process in one cgroup for every controller, so a memory cgroup there would take the device out of its CPU
quota's (``cpu_quota.py``); :meth:`MemoryCgroup.create` refuses v2 with that reason in one line rather than
silently dropping either limit. Written by hand for the reason ``cpu_quota.py`` gives: no kept library creates
cgroups.
"""

from __future__ import annotations

import errno
import math
import os
import secrets
from pathlib import Path

from collapipe_flwr.errors import TestbedError
from collapipe_flwr.testbed.cgroup_hierarchy import (
    Hierarchy,
    available,
    cgroup_path_of,
    detect,
    empty_and_remove,
    procs_of,
    read_value,
    write_value,
)

CONTROLLER = "memory"
PARENT = "collapipe"
FIX = "run as root on Linux with cgroup v1's memory controller, or set testbed.memory_limit=false"
UNLIMITED = -1  # what memory.limit_in_bytes takes for "no limit"


def memory_available() -> str | None:
    """None when memory cgroups can be made here (cgroup v1's memory controller, writable); else the reason."""
    found = detect(controller=CONTROLLER)
    if isinstance(found, str):
        return found
    if found.version != 1:
        return (
            f"the memory controller is on cgroup v2 at {found.mount}, where a process has one cgroup for every "
            "controller (its CPU quota's); only cgroup v1 memory limits are supported"
        )
    return available(CONTROLLER)


def own_memory_limit(pid: int | None = None) -> float | None:
    """The smallest memory limit on process ``pid``'s (default: this one's) memory cgroup and its ancestors up to
    the mount, in bytes: cgroup v1's ``memory.limit_in_bytes``, v2's ``memory.max``; None when none is set or
    there is no memory controller. A device on the testbed has its gamma_k^max here (its own child cgroup, found
    through ``/proc/<pid>/cgroup``, which the hierarchy's top-level file does not show)."""
    found = detect(controller=CONTROLLER)
    if isinstance(found, str):
        return None
    try:
        directory = found.dir_of(cgroup_path_of(os.getpid() if pid is None else pid, found, CONTROLLER))
    except TestbedError:
        return None
    name = "memory.limit_in_bytes" if found.version == 1 else "memory.max"
    limits = []
    while directory is not None:
        try:
            text = read_value(directory / name).strip()
        except (OSError, TestbedError):
            text = ""
        if text.isdigit() and int(text) < 2**60:  # v1 writes "no limit" as a number near 2**63, v2 as "max"
            limits.append(float(text))
        if directory == found.mount or directory.parent == directory:
            break
        directory = directory.parent
    return min(limits) if limits else None


def oom_kills_at(path: Path | str) -> int:
    """The ``oom_kill`` count of the memory cgroup at ``path`` (0 when the file or the counter is missing): read
    after a device process died, to tell a kill by the kernel for memory from any other death."""
    try:
        text = read_value(Path(path) / "memory.oom_control")
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


class MemoryCgroup:
    """A child cgroup of the v1 memory controller holding one process: its limit, its peak, its OOM kills.

    Make one with :meth:`create`; :meth:`remove` (idempotent) moves the process back and removes the directory.
    """

    def __init__(self, hierarchy: Hierarchy, path: Path, origin: Path) -> None:
        self.hierarchy = hierarchy
        self.path = path
        self.origin = origin
        self._removed = False

    @classmethod
    def create(cls, pid: int, name: str) -> MemoryCgroup:
        """Move process ``pid`` into a new memory cgroup ``collapipe/<name>-<creator pid>-<hex>``, unlimited (set
        the budget later with :meth:`set_limit`) and without swap. TestbedError with one line when impossible."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise TestbedError(f"memory cgroup pid={pid!r} must be a positive integer (a process id)")
        reason = memory_available()
        if reason is not None:
            raise TestbedError(f"testbed memory limits need cgroups: {reason}; {FIX}")
        found = detect(controller=CONTROLLER)
        assert isinstance(found, Hierarchy)  # memory_available() returned None
        origin = found.dir_of(cgroup_path_of(pid, found, CONTROLLER)) or found.mount
        parent = found.mount / PARENT
        path = parent / f"{name}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            parent.mkdir(exist_ok=True)
            path.mkdir()
        except OSError as err:
            raise TestbedError(f"cannot create memory cgroup {path}: {err.strerror}; {FIX}") from None
        group = cls(found, path, origin)
        try:
            write_value(path / "memory.swappiness", "0")
            write_value(path / "cgroup.procs", str(pid))
        except OSError as err:
            group.remove()
            raise TestbedError(f"cannot move pid {pid} into memory cgroup {path}: {err.strerror}; {FIX}") from None
        return group

    # ------------------------------------------------------------------------------------ limit and figures
    def set_limit(self, limit_bytes: float | None) -> None:
        """gamma_k^max in bytes (rounded down to whole pages by the kernel); None = unlimited. A limit below what
        the cgroup holds now is refused by the kernel (EBUSY after reclaim fails): TestbedError naming both."""
        self._check_live()
        if limit_bytes is None or math.isinf(limit_bytes):
            text = str(UNLIMITED)
        elif not limit_bytes > 0:
            raise TestbedError(f"memory limit {limit_bytes!r} bytes must be > 0 (gamma_k^max)")
        else:
            text = str(int(limit_bytes))
        try:
            write_value(self.path / "memory.limit_in_bytes", text)
        except OSError as err:
            if err.errno == errno.EBUSY:
                wanted, held = int(limit_bytes or 0) / 2**20, self.usage_bytes() / 2**20
                raise TestbedError(
                    f"memory limit {wanted:.1f} MiB is below the {held:.1f} MiB cgroup {self.path.name} holds now; "
                    "free the device's blocks first"
                ) from None
            raise TestbedError(f"the kernel refused memory limit {text} in {self.path}: {err.strerror}") from None

    def limit_bytes(self) -> float:
        """The limit as the kernel holds it (``math.inf`` for none: v1 reports a huge page-aligned number)."""
        self._check_live()
        value = int(read_value(self.path / "memory.limit_in_bytes"))
        return math.inf if value >= 2**62 else float(value)

    def usage_bytes(self) -> int:
        return int(read_value(self.path / "memory.usage_in_bytes"))

    def peak_bytes(self) -> int:
        """The most the cgroup held since it was made or :meth:`reset_peak` (``memory.max_usage_in_bytes``)."""
        self._check_live()
        return int(read_value(self.path / "memory.max_usage_in_bytes"))

    def reset_peak(self) -> None:
        """Start a new peak from the current usage (the kernel takes a write of 0)."""
        self._check_live()
        write_value(self.path / "memory.max_usage_in_bytes", "0")

    def oom_kills(self) -> int:
        return oom_kills_at(self.path)

    def _check_live(self) -> None:
        if self._removed:
            raise TestbedError(f"memory cgroup {self.path.name} was removed; create a new one")

    # ------------------------------------------------------------------------------------ clean-up
    def remove(self) -> None:
        """Move the process back to where it came from, remove the cgroup and the empty parent. Idempotent."""
        if self._removed:
            return
        empty_and_remove(self.path, (self.origin, self.hierarchy.mount))
        self._removed = True

    def pids(self) -> list[int]:
        return procs_of(self.path)

    def __repr__(self) -> str:
        state = "removed" if self._removed else f"pids={self.pids()}"
        return f"MemoryCgroup({self.path}, {state})"


def remove_path(path: Path | str) -> bool:
    """Remove the memory cgroup at ``path`` of a process that is gone (a device the kernel killed): True when it
    is removed or was already gone; False while a process still holds it."""
    try:
        Path(path).rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        Path(path).parent.rmdir()
    except OSError:
        pass
    return True
