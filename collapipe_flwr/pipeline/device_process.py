"""Where a device's segment runs: its OS process and the host it is on, as the device itself sees them.

The network namespace stands for the host: two processes on different machines, in different containers or in
different Linux network namespaces have different ones, and the CU cannot tell this from its own side (device k's
actor may be on another box). Linux names a namespace by the inode of ``/proc/<pid>/ns/net``; the deployment test
(tests/apps/test_deployment_hosts.py) compares it with the inode of ``/run/netns/<box>``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProcess:
    """Device k's process: ``pid`` on its own host and ``netns``, the inode of its network namespace (0 where the
    OS has none, e.g. macOS)."""

    pid: int
    netns: int


def this_process() -> DeviceProcess:
    """The process calling it (a Stage answers this for its device)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:  # no procfs: not Linux
        netns = 0
    return DeviceProcess(os.getpid(), int(netns))
