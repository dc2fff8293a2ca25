"""What this project's processes leave in ``/dev/shm`` when they are killed, and the sweep that removes it.

Two kinds of entry carry their creator's pid in their name, so that whatever a process left when it died can be
told from what a live one holds:

- a data-plane segment, ``cpdp-<pid>-<hex>`` (a CU's frames on the decoder host's machine, ``fl/dataplane/shm.py``);
  Python's resource tracker unlinks it when the CU dies alone, not when the tracker dies with it (its whole
  process group killed, as a container's stop or the launcher's stop of a run does);
- a hand-over folder, ``collapipe-handoff-<pid>[-<tag>]`` (a device actor's or a pipeline's activations in flight,
  ``pipeline/executors/shm_handoff.py``), which nothing but its reader removes.

:func:`remove_stale` removes the entries whose creator no longer runs. The decoder host sweeps segments when it
starts, a CU's pipeline and each device actor sweep hand-over folders, and ``collapipe run`` sweeps both once it
has stopped a run's processes (then every entry of that run is stale). Kept apart from both users, and free of
torch, so that the launcher can sweep without importing torch (seconds on a small machine).

A reused pid keeps its entry (a later sweep takes it); an entry of another pid namespace that shares this
``/dev/shm`` would look stale: for a segment that only takes its name away (the CU's mapping stays; the host
refuses its next pointer and the CU falls back to inline frames, losing no step).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "cpdp-"  # every data-plane segment; a pointer to any other name is refused (fl/dataplane/shm.py)
HANDOFF_PREFIX = "collapipe-handoff-"  # every hand-over folder (pipeline/executors/shm_handoff.py)


def creator_pid(name: str, prefix: str) -> int | None:
    """The creator's pid in an entry's name, None when the name carries none.

    Segments are ``cpdp-<pid>-<hex>`` (a name without the ``-<hex>`` part is a segment of a version before the pid
    was in the name, whose 16 random hex digits may all be digits: no pid); hand-over folders are
    ``collapipe-handoff-<pid>`` or ``collapipe-handoff-<pid>-<tag>``."""
    if not name.startswith(prefix):
        return None
    pid, sep, rest = name.removeprefix(prefix).partition("-")
    if not pid.isdigit() or (prefix == SEGMENT_PREFIX and not (sep and rest)):
        return None
    return int(pid)


def _running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale(prefix: str, where: Path = SHM_DIR) -> list[Path]:
    """Remove the entries of ``where`` named ``prefix`` + ``<pid>``... whose process ``pid`` no longer runs (files
    unlinked, folders removed with what they hold); returns them. Nothing is removed without a ``/proc`` to ask."""
    if not Path("/proc/self").exists() or not where.is_dir():
        return []
    removed = []
    for path in sorted(where.glob(prefix + "*")):
        pid = creator_pid(path.name, prefix)
        if pid is None or _running(pid):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed.append(path)
    return removed


def remove_all_stale(where: Path = SHM_DIR) -> list[Path]:
    """Both kinds at once (``collapipe run`` after it stopped a run's processes)."""
    return remove_stale(SEGMENT_PREFIX, where) + remove_stale(HANDOFF_PREFIX, where)
