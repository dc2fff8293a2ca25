"""Finding and stopping the processes one sweep job started, by pid (never by a broad name).

``flwr run`` starts a detached local SuperLink that outlives the command; it is recognised by its
``--database`` path inside the job's private FLWR_HOME. Its simulation children (the ServerApp /
ClientApp processes, Ray's GCS, raylet and workers) are found through the parent links in /proc,
collected *before* anything is killed so that re-parented children are not lost.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int | None:
    """The parent pid from /proc/<pid>/stat (the field after the ``(comm)`` that may hold spaces)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()] if PROC.is_dir() else []


def pids_with_text(text: str) -> list[int]:
    """Pids (other than this process) whose command line contains ``text``."""
    me = os.getpid()
    return [pid for pid in _all_pids() if pid != me and text in _cmdline(pid)]


def descendants(roots: list[int]) -> list[int]:
    """Every live process below ``roots`` (children, grandchildren, ...), roots excluded."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found, todo = [], list(roots)
    seen = set(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_pids(pids: list[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM each pid, wait up to ``grace_s``, then SIGKILL the ones left. Returns the pids signalled."""
    pids = [p for p in dict.fromkeys(pids) if p != os.getpid()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return pids


def stop_tree(roots: list[int], grace_s: float = 10.0) -> list[int]:
    """Stop ``roots`` and all their descendants (snapshotted first). Returns the pids signalled."""
    return stop_pids(list(roots) + descendants(list(roots)), grace_s)


def stop_processes_mentioning(text: str, grace_s: float = 10.0) -> list[int]:
    """Stop every process whose command line contains ``text`` (a private path), and its descendants."""
    return stop_tree(pids_with_text(text), grace_s)
