"""Finding and stopping the processes one sweep job started, by pid (never by a broad name).

``flwr run`` starts a detached local SuperLink that outlives the command; it is recognised by its
``--database`` path inside the job's private FLWR_HOME. Its simulation children (the ServerApp /
ClientApp processes, Ray's GCS, raylet and workers) are found through their parent pids (psutil),
collected *before* anything is killed so that re-parented children are not lost.

Signals go through :class:`psutil.Process` objects taken when the pids are collected, so a pid that
was reused by an unrelated process in the meantime is left alone. Zombies count as dead: their
parent (often init, or a Ray process) reaps them; nothing here reaps a child it did not wait for.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)  # ZombieProcess is a NoSuchProcess; named for clarity


def _cmdline(info: dict) -> str:
    """The command line from a ``process_iter`` info dict ("" when hidden: AccessDenied gives None)."""
    return " ".join(info.get("cmdline") or [])


def pids_with_text(text: str) -> list[int]:
    """Pids (other than this process) whose command line contains ``text``."""
    me = os.getpid()
    return [
        proc.info["pid"]
        for proc in psutil.process_iter(["pid", "cmdline"])
        if proc.info["pid"] != me and text in _cmdline(proc.info)
    ]


def descendants(roots: list[int]) -> list[int]:
    """Every live process below ``roots`` (children, grandchildren, ...), roots excluded.

    One snapshot of the whole process table's parent links is taken first, so a child whose parent
    dies while we walk is still found below it.
    """
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["pid", "ppid"]):
        parent = proc.info["ppid"]
        if parent is not None:
            children.setdefault(parent, []).append(proc.info["pid"])
    found, todo = [], list(roots)
    seen = set(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _running(proc: psutil.Process) -> bool:
    """Whether ``proc`` (the very process, not a reuse of its pid) is still running; zombies are dead."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False
    except psutil.AccessDenied:
        return True


def alive(pid: int) -> bool:
    """Whether ``pid`` names a process that has not exited (a zombie counts as dead)."""
    try:
        return _running(psutil.Process(pid))
    except _GONE:
        return False
    except psutil.AccessDenied:
        return True


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)  # psutil checks first that the pid was not reused
    except (*_GONE, psutil.AccessDenied):
        pass


def stop_pids(pids: list[int], grace_s: float = 10.0, kill_wait_s: float = 10.0) -> list[int]:
    """SIGTERM each pid, wait up to ``grace_s``, then SIGKILL the ones left and wait up to ``kill_wait_s`` for
    them to be gone (SIGKILL is delivered asynchronously: on a loaded machine a killed process can still be
    running for a moment, and a caller that checks right after would see it). Returns the pids signalled.

    This process is never signalled. Waiting polls :func:`alive`'s test instead of ``psutil.wait_procs``,
    which would reap our own children (taking their exit status from a ``subprocess.Popen``) and would
    wait the whole grace for a zombie that is not ours.
    """
    pids = [p for p in dict.fromkeys(pids) if p != os.getpid()]
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except (*_GONE, psutil.AccessDenied):
            pass
    for proc in procs:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_running(p) for p in procs):
        time.sleep(0.2)
    killed = [proc for proc in procs if _running(proc)]
    for proc in killed:
        _signal(proc, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while time.monotonic() < deadline and any(_running(p) for p in killed):
        time.sleep(0.05)
    return pids


def stop_tree(roots: list[int], grace_s: float = 10.0) -> list[int]:
    """Stop ``roots`` and all their descendants (snapshotted first). Returns the pids signalled."""
    return stop_pids(list(roots) + descendants(list(roots)), grace_s)


def stop_processes_mentioning(text: str, grace_s: float = 10.0) -> list[int]:
    """Stop every process whose command line contains ``text`` (a private path), and its descendants."""
    return stop_tree(pids_with_text(text), grace_s)
