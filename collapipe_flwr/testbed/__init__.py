"""OS-level primitives of an emulated heterogeneous edge testbed, one idea a module.

* :mod:`.cpu_quota`: an OS-enforced CPU share for a process (all its threads and later children) through a
  cgroup (v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``), so one box can stand in for devices of unequal speed;
* :mod:`.cgroup_hierarchy`: which mounted cgroup hierarchy holds a usable ``cpu`` controller (for
  :mod:`.cpu_quota`), found from ``/proc/self/mountinfo``;
* :mod:`.memory_limit`: an OS-enforced memory budget for a process (cgroup v1 ``memory.limit_in_bytes``), its
  peak (``memory.max_usage_in_bytes``) and whether the kernel killed it for memory (``oom_kill``);
* :mod:`.token_bucket`: a thread-safe token bucket that paces byte transfers to a link rate, with an
  emulated fixed latency per transfer (``tc netem`` does not work on every kernel);
* :mod:`.tc_shaper`: the same pacing done by the kernel on an interface, a ``tc ... tbf`` root qdisc.

Base layer: imports only :mod:`collapipe_flwr.errors` and the standard library.
"""

from __future__ import annotations

from collapipe_flwr.testbed.cgroup_hierarchy import Hierarchy, detect
from collapipe_flwr.testbed.cgroup_hierarchy import available as cpu_quota_available
from collapipe_flwr.testbed.cpu_quota import CpuQuota, remove_stale
from collapipe_flwr.testbed.memory_limit import MemoryCgroup, memory_available, oom_kills_at
from collapipe_flwr.testbed.tc_shaper import TbfSettings, TcShaper
from collapipe_flwr.testbed.tc_shaper import available as tc_available
from collapipe_flwr.testbed.token_bucket import TokenBucket, refill_bytes, throttle_seconds

__all__ = [
    "CpuQuota",
    "Hierarchy",
    "MemoryCgroup",
    "TbfSettings",
    "TcShaper",
    "TokenBucket",
    "cpu_quota_available",
    "detect",
    "memory_available",
    "oom_kills_at",
    "refill_bytes",
    "remove_stale",
    "tc_available",
    "throttle_seconds",
]
