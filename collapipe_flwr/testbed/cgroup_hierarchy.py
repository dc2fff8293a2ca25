"""Which mounted cgroup hierarchy holds a usable ``cpu`` controller, and the cgroup file I/O :mod:`.cpu_quota` uses.

Two kernel interfaces hold a CPU quota, and :func:`detect` picks the one whose ``cpu`` controller is usable:

* cgroup v1: a hierarchy mounted with the ``cpu`` controller (``/sys/fs/cgroup/cpu``); a child cgroup's
  ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us`` (``-1`` = unlimited), its members in ``cgroup.procs``;
* cgroup v2 (unified): ``cpu`` listed in the root's ``cgroup.controllers``; ``+cpu`` written to each
  ancestor's ``cgroup.subtree_control`` (:func:`enable_controller`), then the child's ``cpu.max`` holds
  ``"<quota> <period>"`` (``max`` = unlimited). On a hybrid system the cgroup2 mount exists but the ``cpu``
  controller is bound to v1, so v2 is not usable there and v1 is taken.

Reads ``/proc/self/mountinfo`` and ``/proc/<pid>/cgroup`` (proc(5)); creates nothing except through
:func:`write_value` and :func:`enable_controller`, which the caller directs.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import sys
import time
from pathlib import Path

from collapipe_flwr.errors import TestbedError

_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy that holds the ``cpu`` controller.

    ``version`` is 1 or 2; ``mount`` the directory it is mounted on; ``root`` the cgroup path that
    directory shows ("/" unless a sub-cgroup is bind-mounted there, as in some containers), needed to map
    a process's ``/proc/<pid>/cgroup`` path to a directory.
    """

    version: int
    mount: Path
    root: str = "/"

    def dir_of(self, cgroup_path: str) -> Path | None:
        """The directory of the cgroup at ``cgroup_path`` (as in ``/proc/<pid>/cgroup``); None outside the mount."""
        root = self.root.rstrip("/")
        if cgroup_path != root and not cgroup_path.startswith(root + "/"):
            return None
        rel = cgroup_path[len(root) :].strip("/")
        return self.mount / rel if rel else self.mount


def _unescape(field: str) -> str:
    """A mountinfo path field with the kernel's octal escapes (``\\040`` = space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[tuple[Path, str, str, set[str]]]:
    """``(mount point, root, fstype, super options)`` of each cgroup / cgroup2 line of ``/proc/*/mountinfo``.

    Format (proc(5)): ``id parent major:minor root mount-point options [optional...] - fstype source
    super-options``; a v1 hierarchy names its controllers in the super options (``rw,cpu,cpuacct``).
    """
    found = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        opts = set(fields[sep + 3].split(",")) if len(fields) > sep + 3 else set()
        found.append((Path(_unescape(fields[4])), _unescape(fields[3]), fstype, opts))
    return found


def read_value(path: Path) -> str:
    """A cgroup file's content, stripped."""
    return path.read_text(encoding="ascii").strip()


def write_value(path: Path, text: str) -> None:
    """One ``write(2)`` of ``text`` to a cgroup file (the kernel takes one value, e.g. one pid, per write)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def _v2_reason(mount: Path, controller: str = "cpu") -> str | None:
    """None when the cgroup2 mount's ``controller`` can be used; else why not (one clause)."""
    try:
        controllers = read_value(mount / "cgroup.controllers").split()
    except OSError as err:
        return f"cannot read {mount / 'cgroup.controllers'}: {err.strerror}"
    if controller not in controllers:
        shown = " ".join(controllers) or "none"
        return f"cgroup2 at {mount} has no {controller} controller (cgroup.controllers: {shown}; bound to cgroup v1?)"
    try:
        enabled = read_value(mount / "cgroup.subtree_control").split()
        procs = read_value(mount / "cgroup.procs").split()
    except OSError as err:
        return f"cannot read the cgroup files in {mount}: {err.strerror}"
    # The no-internal-process rule: +<controller> cannot be enabled below a non-root cgroup that holds processes
    # (the namespace root in a container); the true root (no cgroup.type file) is exempt.
    if controller not in enabled and procs and (mount / "cgroup.type").exists():
        return f"cgroup2 at {mount} holds processes, so +{controller} cannot be enabled in its cgroup.subtree_control"
    return None


def detect(mountinfo: str | None = None, controller: str = "cpu") -> Hierarchy | str:
    """The hierarchy whose ``controller`` (``cpu``, ``memory``) is usable (v2 when usable, else v1), or why there
    is none.

    ``mountinfo`` defaults to ``/proc/self/mountinfo``'s text. Reads only; creates nothing.
    """
    if not sys.platform.startswith("linux"):
        return f"not Linux (sys.platform={sys.platform})"
    if mountinfo is None:
        try:
            mountinfo = _MOUNTINFO.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            return f"cannot read {_MOUNTINFO}: {err.strerror}"
    mounts = parse_mountinfo(mountinfo)
    reasons = []
    for mount, root, fstype, _ in mounts:
        if fstype == "cgroup2":
            reason = _v2_reason(mount, controller)
            if reason is None:
                return Hierarchy(2, mount, root)
            reasons.append(reason)
    for mount, root, fstype, opts in mounts:
        if fstype == "cgroup" and controller in opts:
            return Hierarchy(1, mount, root)
    if not reasons:
        return (
            f"no cgroup {controller} controller mounted (no cgroup v1 '{controller}' hierarchy nor cgroup2 in "
            "/proc/self/mountinfo)"
        )
    return f"no cgroup v1 '{controller}' hierarchy mounted and " + "; ".join(reasons)


def available(controller: str = "cpu") -> str | None:
    """None when ``controller``'s cgroups (CPU quotas, memory limits) can be made here; else a one-line reason
    ("not root", "no cpu controller ...")."""
    found = detect(controller=controller)
    if isinstance(found, str):
        return found
    if not os.access(found.mount, os.W_OK):
        if os.geteuid() != 0:
            return f"not root (euid {os.geteuid()}) and {found.mount} is not writable"
        return f"{found.mount} is not writable (a read-only cgroup mount, as in an unprivileged container)"
    return None


def cgroup_path_of(pid: int, hierarchy: Hierarchy, controller: str = "cpu") -> str:
    """``pid``'s cgroup path in ``hierarchy`` (the one holding ``controller``), from ``/proc/<pid>/cgroup``
    (``id:controllers:path`` lines)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TestbedError(f"no process with pid {pid} (it exited?); start it before applying its cpu quota") from None
    for line in lines:
        ident, controllers, path = line.split(":", 2)
        if hierarchy.version == 2 and ident == "0" and controllers == "":
            return path
        if hierarchy.version == 1 and controller in controllers.split(","):
            return path
    return hierarchy.root


def enable_controller(directory: Path, controller: str = "cpu") -> None:
    """v2: write ``+<controller>`` (default ``+cpu``) to ``directory``'s ``cgroup.subtree_control`` unless already
    enabled there."""
    control = directory / "cgroup.subtree_control"
    if controller not in read_value(control).split():
        write_value(control, f"+{controller}")


def procs_of(path: Path) -> list[int]:
    """The processes (thread-group ids) in the cgroup at ``path`` now; [] once it is gone."""
    try:
        return [int(p) for p in read_value(path / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def empty_and_remove(path: Path, targets: tuple[Path, ...]) -> None:
    """Move every process of the cgroup at ``path`` to the first of ``targets`` that takes it (its origin, then the
    hierarchy's root; one that exited meanwhile is skipped), rmdir it and then its parent when that is empty.
    Raises TestbedError only when processes keep joining it."""
    for _ in range(50):
        for pid in procs_of(path):
            for target in targets:
                try:
                    write_value(target / "cgroup.procs", str(pid))
                    break
                except ProcessLookupError:
                    break
                except OSError:
                    continue
        try:
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError as err:
            if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                raise TestbedError(f"cannot remove cgroup {path}: {err.strerror}") from None
            time.sleep(0.01)
    else:
        raise TestbedError(f"cannot remove cgroup {path}: processes {procs_of(path)} keep joining it")
    try:
        path.parent.rmdir()  # only when empty: another cgroup of this project may still use it
    except OSError:
        pass
