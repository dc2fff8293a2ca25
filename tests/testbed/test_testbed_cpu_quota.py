"""collapipe_flwr.testbed.cpu_quota: a real process under a cgroup CPU quota, measured; the refusals and parsers.

The throttling test needs root and a cgroup cpu controller and skips with ``available()``'s reason
elsewhere; every other test runs anywhere. Each test removes what it creates, even when it fails.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from collapipe_flwr import errors
from collapipe_flwr.testbed import cgroup_hierarchy as ch
from collapipe_flwr.testbed import cpu_quota as cq
from collapipe_flwr.testbed.cgroup_hierarchy import Hierarchy
from collapipe_flwr.testbed.cpu_quota import CpuQuota

# Spins for at most 3 s of wall time from its own start, then exits: bounded even if the test dies.
BUSY = "import time\nt0 = time.monotonic()\nprint('ready', flush=True)\nwhile time.monotonic() - t0 < 3.0:\n    pass\n"


# Two threads hashing 1 MB buffers (hashlib releases the GIL), so unthrottled it would use two cores.
BUSY_THREADS = (
    "import hashlib, threading, time\nt0 = time.monotonic()\nbuf = bytes(1 << 20)\n"
    "def spin():\n    while time.monotonic() - t0 < 3.0:\n        hashlib.sha256(buf)\n"
    "threads = [threading.Thread(target=spin) for _ in range(2)]\n"
    "[t.start() for t in threads]\nprint('ready', flush=True)\n[t.join() for t in threads]\n"
)


def _higher_priority() -> None:
    """In the child before exec: nice -5 where allowed (root), so other load on the shared box does not
    starve it below its quota and the quota alone limits it (capped at a fraction of a core, it harms none)."""
    try:
        os.nice(-5)
    except OSError:
        pass


def _start(code: str):
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=_higher_priority
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.fixture
def busy_child():
    yield from _start(BUSY)


@pytest.fixture
def busy_threads_child():
    yield from _start(BUSY_THREADS)


@pytest.fixture
def quotas():
    made: list[CpuQuota] = []
    try:
        yield made
    finally:
        for quota in made:
            quota.remove()


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _cpu_cgroup_line(pid: int, version: int) -> str:
    """The line of /proc/<pid>/cgroup for the hierarchy that holds the cpu controller."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        ident, controllers, _ = line.split(":", 2)
        if (version == 2 and ident == "0") or (version == 1 and "cpu" in controllers.split(",")):
            return line
    raise AssertionError(f"no cpu cgroup line for pid {pid}")


@pytest.mark.e2e
def test_quota_throttles_a_real_process_to_a_quarter_core(busy_child, quotas):
    hierarchy = _needs_quotas()
    before = _cpu_cgroup_line(busy_child.pid, hierarchy.version)
    quota = CpuQuota.apply(busy_child.pid, 0.25, "pytest-busy")
    assert _cpu_cgroup_line(busy_child.pid, hierarchy.version).endswith("/" + cq.PARENT + "/" + quota.path.name)
    quotas.append(quota)
    path = quota.path
    assert path.parent == hierarchy.mount / cq.PARENT and path.name.startswith("pytest-busy-")

    # Independent reads of the kernel's files, not the object's attributes.
    if hierarchy.version == 2:
        quota_text, period_text = (path / "cpu.max").read_text().split()
    else:
        quota_text, period_text = (path / "cpu.cfs_quota_us").read_text(), (path / "cpu.cfs_period_us").read_text()
    assert int(quota_text) == round(0.25 * int(period_text))
    assert str(busy_child.pid) in (path / "cgroup.procs").read_text().split()
    assert quota.read_back() == pytest.approx(0.25)

    time.sleep(0.1)
    cpu0, wall0 = _cpu_seconds(busy_child.pid), time.monotonic()
    time.sleep(2.0)
    cpu1, wall1 = _cpu_seconds(busy_child.pid), time.monotonic()
    share = (cpu1 - cpu0) / (wall1 - wall0)
    print(f"child CPU share {share:.3f} of a core under a 0.25 quota; throttled {quota.throttled()}")
    # The quota is a ceiling, not a grant: on a loaded host the child may get less (other processes want the
    # cores too), never more. The floor catches a unit error (a quota 10x too small reads 0.025).
    assert 0.5 * 0.25 <= share <= 1.2 * 0.25
    assert quota.throttled()[0] > 0

    quota.remove()
    assert not path.exists()
    assert quota.pids() == []
    if busy_child.poll() is None:  # still spinning: back in the cgroup it came from
        assert _cpu_cgroup_line(busy_child.pid, hierarchy.version) == before
    quota.remove()  # idempotent
    assert not any(p.name.startswith("pytest-busy-") for p in (hierarchy.mount / cq.PARENT).glob("*"))


def _needs_quotas() -> Hierarchy:
    reason = cq.available()
    if reason is not None:
        pytest.skip(f"cgroup cpu quotas not available here: {reason}")
    found = cq.detect()
    assert isinstance(found, Hierarchy)
    return found


@pytest.mark.e2e
def test_quota_holds_all_threads_of_the_process_together(busy_threads_child, quotas):
    hierarchy = _needs_quotas()
    pid = busy_threads_child.pid
    quota = CpuQuota.apply(pid, 0.5, "pytest-threads")
    quotas.append(quota)
    threads = {t.id for t in psutil.Process(pid).threads()}
    listed = (quota.path / ("cgroup.threads" if hierarchy.version == 2 else "tasks")).read_text().split()
    assert len(threads) >= 3 and threads <= {int(t) for t in listed}
    time.sleep(0.1)
    cpu0, wall0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(1.5)
    share = (_cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)
    print(f"two busy threads: CPU share {share:.3f} of a core together under a 0.5 quota")
    # Two spinning threads would take up to 2 cores unlimited: at most 1.2x the quota means it holds them together
    # (a ceiling; on a loaded host they may get less). The floor catches a unit error.
    assert 0.5 * 0.5 <= share <= 1.2 * 0.5


@pytest.mark.e2e
def test_remove_stale_takes_only_dead_runs_cgroups(quotas):
    hierarchy = _needs_quotas()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    stale = hierarchy.mount / cq.PARENT / f"pytest-stale-{dead.pid}-00000000"
    live = CpuQuota.apply(os.getpid(), 4, "pytest-live")  # this process: its creator is alive
    quotas.append(live)
    try:
        stale.mkdir()
        assert stale in cq.remove_stale()
        assert not stale.exists() and live.path.exists() and live.pids() == [os.getpid()]
    finally:
        if stale.exists():
            stale.rmdir()


@pytest.mark.e2e
def test_a_process_that_exited_is_refused_and_nothing_is_left(quotas):
    hierarchy = _needs_quotas()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    with pytest.raises(errors.TestbedError, match=f"no process with pid {dead.pid} "):
        CpuQuota.apply(dead.pid, 0.25, "pytest-dead")
    assert not list((hierarchy.mount / cq.PARENT).glob("pytest-dead-*"))


@pytest.mark.e2e
def test_context_manager_set_cores_and_unique_names(busy_child, quotas):
    _needs_quotas()
    with CpuQuota.apply(busy_child.pid, 0.5, "pytest-cm") as one, CpuQuota.apply(os.getpid(), 4, "pytest-cm") as two:
        quotas.extend([one, two])
        assert one.path != two.path and one.path.parent == two.path.parent
        assert two.pids() == [os.getpid()] and two.read_back() == 4
        one.set_cores(0.1)
        assert one.read_back() == pytest.approx(0.1)
    assert not one.path.exists() and not two.path.exists()
    with pytest.raises(errors.TestbedError, match="was removed"):
        one.read_back()


def test_apply_refuses_in_one_line_when_quotas_are_not_available(monkeypatch):
    monkeypatch.setattr(cq, "available", lambda: "not root (euid 1000) and /sys/fs/cgroup/cpu is not writable")
    with pytest.raises(errors.TestbedError) as info:
        CpuQuota.apply(os.getpid(), 0.25, "refused")
    message = str(info.value)
    assert "\n" not in message
    assert "not root (euid 1000)" in message and "testbed.cpu_quota=false" in message
    assert message.startswith("runtime.testbed needs cgroup cpu quotas: ")


@pytest.mark.parametrize(
    ("pid", "cores", "name", "match"),
    [
        (1, 0, "x", "must be a finite number > 0"),
        (1, math.nan, "x", "must be a finite number > 0"),
        (1, math.inf, "x", "must be a finite number > 0"),
        (1, 0.005, "x", "below the kernel's 1000 us minimum"),
        (1, 0.25, "a/b", "must be 1-48 characters"),
        (1, 0.25, "-x", "must be 1-48 characters"),
        (0, 0.25, "x", "must be a positive integer"),
        (True, 0.25, "x", "must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused_before_touching_cgroups(pid, cores, name, match):
    with pytest.raises(errors.TestbedError, match=match):
        CpuQuota.apply(pid, cores, name, hierarchy=Hierarchy(1, Path("/nonexistent")))


def test_quota_and_cores_arithmetic():
    assert cq.quota_us(0.25) == 25_000 and cq.quota_us(2, 50_000) == 100_000
    with pytest.raises(errors.TestbedError, match="period"):
        cq.quota_us(1, 500)
    assert cq.parse_cores("25000 100000", 2) == 0.25
    assert cq.parse_cores("max 100000", 2) == math.inf
    assert cq.parse_cores("50000\n", 1, "100000\n") == 0.5
    assert cq.parse_cores("-1", 1, "100000") == math.inf


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 31 0:40 /docker/abc /mnt/my\\040cg rw shared:5 - cgroup cgroup rw,cpu,cpuacct
"""


def test_mountinfo_parsing_and_the_bind_mounted_root():
    found = ch.parse_mountinfo(HYBRID)
    assert [(str(m), r, t) for m, r, t, _ in found] == [
        ("/sys/fs/cgroup/cpu", "/", "cgroup"),
        ("/sys/fs/cgroup/cpuacct", "/", "cgroup"),
        ("/sys/fs/cgroup/unified", "/", "cgroup2"),
        ("/mnt/my cg", "/docker/abc", "cgroup"),
    ]
    assert found[3][3] == {"rw", "cpu", "cpuacct"}
    h = Hierarchy(1, Path("/mnt/cg"), "/docker/abc")
    assert h.dir_of("/docker/abc") == Path("/mnt/cg")
    assert h.dir_of("/docker/abc/x/y") == Path("/mnt/cg/x/y")
    assert h.dir_of("/docker/abcd") is None and h.dir_of("/") is None
    assert Hierarchy(2, Path("/sys/fs/cgroup")).dir_of("/user.slice") == Path("/sys/fs/cgroup/user.slice")


def _fake_v2(root: Path, controllers: str, procs: str = "", non_root: bool = False) -> str:
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("\n")
    (root / "cgroup.procs").write_text(procs)
    if non_root:
        (root / "cgroup.type").write_text("domain\n")
    return f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="detect() answers 'not Linux' elsewhere")
def test_detect_prefers_a_usable_v2_and_falls_back_to_v1(tmp_path):
    v2 = _fake_v2(tmp_path, "cpuset cpu io memory")
    assert ch.detect(v2) == Hierarchy(2, tmp_path, "/")
    # Hybrid: cgroup2 without the cpu controller, v1 'cpu' hierarchy taken.
    hybrid = _fake_v2(tmp_path, "hugetlb") + "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    assert ch.detect(hybrid) == Hierarchy(1, Path("/sys/fs/cgroup/cpu"), "/")
    only_v2 = _fake_v2(tmp_path, "hugetlb")
    reason = ch.detect(only_v2)
    assert isinstance(reason, str) and "has no cpu controller (cgroup.controllers: hugetlb" in reason
    # A container's namespace root holding processes cannot enable +cpu below itself.
    busy_ns_root = _fake_v2(tmp_path, "cpu memory", procs="1\n7\n", non_root=True)
    reason = ch.detect(busy_ns_root)
    assert isinstance(reason, str) and "holds processes" in reason
    reason = ch.detect("22 1 0:21 / /proc rw - proc proc rw\n")
    assert isinstance(reason, str) and reason.startswith("no cgroup cpu controller mounted") and "\n" not in reason
