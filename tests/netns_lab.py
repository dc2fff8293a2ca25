"""Hosts on one machine for the deployment test: each box a Linux network namespace, all joined to one bridge.

``NetnsLab(boxes)`` makes a hub namespace holding a bridge and, per box, a namespace ``<prefix>-<box>`` with a
veth pair (one end on the bridge, the other the box's ``eth0`` with its address in 10.213.0.0/24) and its own
loopback. Boxes reach each other only through the bridge, at the addresses the lab gave them; nothing is added to
the machine's own namespace. Processes started in a box are remembered and stopped by pid (with their
descendants) on ``close``, then the namespaces are deleted (a veth pair goes with its namespace), so nothing is
left behind; ``close`` is idempotent and runs from ``with``.

Needs root and ``ip`` (iproute2) with bridge and veth support: :func:`why_not_available` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from collapipe_flwr.experiments.processes import stop_pids

SUBNET = "10.213.0"


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def why_not_available() -> str:
    """'' when this machine can make network namespaces joined by a bridge, else why not (a skip reason)."""
    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create Linux network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to create network namespaces"
    probe = f"cpprobe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", "br0", "type", "bridge", netns=probe)
        _ip("link", "add", "v0", "type", "veth", "peer", "name", "v1", netns=probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        return f"cannot create a network namespace with a bridge and a veth pair here: {err}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return ""


class NetnsLab:
    """Boxes as network namespaces on one bridge (module docstring)."""

    def __init__(self, boxes: list[str]) -> None:
        self.prefix = f"cpd{uuid.uuid4().hex[:5]}"
        self.hub = f"{self.prefix}-hub"
        self.address = {box: f"{SUBNET}.{10 + i}" for i, box in enumerate(boxes)}
        self._made: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def netns(self, box: str) -> str:
        return f"{self.prefix}-{box}"

    def netns_inode(self, box: str) -> int:
        """The inode naming ``box``'s namespace, as /proc/<pid>/ns/net of a process inside it reads."""
        return os.stat(f"/run/netns/{self.netns(box)}").st_ino

    def _make(self) -> None:
        _ip("netns", "add", self.hub)
        self._made.append(self.hub)
        _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
        _ip("link", "set", "br0", "up", netns=self.hub)
        for i, (box, address) in enumerate(self.address.items()):
            ns, outer = self.netns(box), f"{self.prefix}h{i}"
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", outer, "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", outer, "master", "br0", "up", netns=self.hub)
            _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)

    def start(self, box: str, command: str, log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
        """``command`` (bash) in ``box``, in the background, output to ``log``; stopped by :meth:`close`."""
        fh = open(log, "w")  # noqa: SIM115 - kept open for the process's life, closed in close()
        self._logs.append(fh)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(box), "bash", "-c", command],
            env=env,
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def run(self, box: str, command: str, env: dict[str, str], cwd: Path, timeout_s: float):
        """``command`` (bash) in ``box`` to its end: the CompletedProcess (stdout and stderr as text)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns(box), "bash", "-c", command],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def close(self) -> None:
        """Stop every started process (by pid, with descendants), then any process still inside one of the
        lab's namespaces (a child its parent left behind, re-parented away from it: a refused SuperNode's
        SuperExec does that), then delete the namespaces."""
        stop_pids([p.pid for p in self._procs])
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        stop_pids(self.pids_inside())
        for fh in self._logs:
            fh.close()
        self._logs.clear()
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made.clear()

    def pids_inside(self) -> list[int]:
        """Processes running in any namespace of this lab (``ip netns pids``)."""
        pids: list[int] = []
        for ns in self._made:
            listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
            pids += [int(pid) for pid in listed.stdout.split()]
        return pids

    def leftovers(self) -> list[str]:
        """Namespaces of this lab that still exist (after close: should be none)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        return [line.split()[0] for line in listed.splitlines() if line.startswith(self.prefix)]

    def __enter__(self) -> NetnsLab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
