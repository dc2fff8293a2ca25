"""A link rate on a network interface: a token-bucket filter (``tc qdisc ... root tbf``) from iproute2.

Where the devices of the emulated testbed talk over a real interface (or over ``lo`` inside their own
network namespace), the kernel can pace the bytes instead of :class:`~.token_bucket.TokenBucket`:
``tc qdisc add dev <dev> root handle <h>: tbf rate <bits>bit burst <bytes>b latency <us>us``. It shapes
what the interface *sends* (egress; on ``lo`` that is both directions of a local connection). ``tc netem``
(an added delay) does not work on every kernel this testbed runs on, tbf does; tbf's ``latency`` is not a
delay: it bounds how long a packet may wait in the filter's queue before it is dropped, hence the name
``queue_latency_s`` here. Emulate a propagation delay with ``TokenBucket(latency_s=...)``.

Written by hand: no library kept in this project drives ``tc``; the few commands below are the interface
(tc-tbf(8)), read back through ``tc -j qdisc show`` (JSON: rate in bytes/s, burst in bytes, lat in us).
Every failure is a :class:`TestbedError` with one line: ``tc`` missing, not allowed, or refusing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys

from collapipe_flwr.errors import TestbedError
from collapipe_flwr.testbed.removal import RemovedOnExit

FIX = "run as root (CAP_NET_ADMIN) on Linux with iproute2's tc, or set testbed.tc_shaper=false"
_DEV = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
_NETNS = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TIMEOUT_S = 10


@dataclasses.dataclass(frozen=True)
class TbfSettings:
    """A tbf qdisc's settings as the kernel holds them (``queue_latency_s`` derived by tc from its limit)."""

    rate_bytes_per_s: float
    burst_bytes: int
    queue_latency_s: float


def available() -> str | None:
    """None when tc can shape interfaces here; else a one-line reason ("not Linux", "tc not found", ...)."""
    if not sys.platform.startswith("linux"):
        return f"not Linux (sys.platform={sys.platform})"
    if shutil.which("tc") is None:
        return "tc (iproute2) not found on PATH"
    if os.geteuid() != 0:
        return f"not root (euid {os.geteuid()}): changing a qdisc needs CAP_NET_ADMIN"
    return None


def tbf_args(rate_bytes_per_s: float, burst_bytes: int, queue_latency_s: float) -> list[str]:
    """The ``tbf`` arguments of tc for the settings, with explicit units (tc's ``bps`` means *bytes*/s, so
    the rate is given in ``bit``); checks the ranges."""
    if isinstance(rate_bytes_per_s, bool) or not isinstance(rate_bytes_per_s, int | float):
        raise TestbedError(f"tc shaper rate_bytes_per_s={rate_bytes_per_s!r} must be a number")
    if not (math.isfinite(rate_bytes_per_s) and rate_bytes_per_s >= 1):
        raise TestbedError(
            f"tc shaper rate_bytes_per_s={rate_bytes_per_s!r} must be finite and >= 1; leave an unlimited link unshaped"
        )
    if isinstance(burst_bytes, bool) or not isinstance(burst_bytes, int) or burst_bytes < 1:
        raise TestbedError(f"tc shaper burst_bytes={burst_bytes!r} must be an integer >= 1 (at least the MTU)")
    if not isinstance(queue_latency_s, int | float) or not (0 < queue_latency_s < math.inf):
        raise TestbedError(f"tc shaper queue_latency_s={queue_latency_s!r} must be a finite number of seconds > 0")
    rate_bit = round(rate_bytes_per_s * 8)
    latency_us = max(1, round(queue_latency_s * 1e6))
    return ["tbf", "rate", f"{rate_bit}bit", "burst", f"{burst_bytes}b", "latency", f"{latency_us}us"]


def parse_tbf(qdiscs_json: str) -> TbfSettings | None:
    """The root tbf of ``tc -j qdisc show dev <dev>``'s output, None when the root qdisc is not a tbf."""
    for qdisc in json.loads(qdiscs_json or "[]"):
        if qdisc.get("root") and qdisc.get("kind") == "tbf":
            opts = qdisc.get("options", {})
            return TbfSettings(float(opts["rate"]), int(opts["burst"]), int(opts.get("lat", 0)) / 1e6)
    return None


def _run(argv: list[str], what: str) -> str:
    """Run one iproute2 command; its stdout, or TestbedError with the command's first stderr line."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise TestbedError(f"{what}: {argv[0]} not found; {FIX}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{what}: `{' '.join(argv)}` did not answer in {_TIMEOUT_S} s") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[0]
        raise TestbedError(f"{what}: `{' '.join(argv)}` refused: {first}")
    return done.stdout


class TcShaper(RemovedOnExit):
    """A root tbf qdisc on one interface (optionally inside a network namespace); see the module docstring.

    Make one with :meth:`apply`; use it as a context manager or call :meth:`remove` (idempotent; restores
    the interface's default qdisc).
    """

    def __init__(self, dev: str, netns: str | None, handle: str) -> None:
        self.dev = dev
        self.netns = netns
        self.handle = handle  # "<major>:" as tc shows it; remove() deletes only the qdisc it added
        self._removed = False

    def _argv(self, *args: str) -> list[str]:
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return [*prefix, *args]

    @classmethod
    def apply(
        cls,
        dev: str,
        rate_bytes_per_s: float,
        burst_bytes: int,
        queue_latency_s: float = 0.05,
        *,
        netns: str | None = None,
    ) -> TcShaper:
        """Shape what ``dev`` sends to ``rate_bytes_per_s`` with bursts of ``burst_bytes`` (>= its MTU).

        Refuses (TestbedError, one line) when tc is not usable, the device is unknown, already has a root
        qdisc other than the default, or ``burst_bytes`` is below its MTU (packets larger than the burst
        could never pass).
        """
        args = tbf_args(rate_bytes_per_s, burst_bytes, queue_latency_s)
        if not isinstance(dev, str) or not _DEV.fullmatch(dev):
            raise TestbedError(f"tc shaper dev={dev!r} must be an interface name (1-15 characters, e.g. eth0)")
        if netns is not None and (not isinstance(netns, str) or not _NETNS.fullmatch(netns)):
            raise TestbedError(f"tc shaper netns={netns!r} must be a network namespace name from `ip netns list`")
        reason = available()
        if reason is not None:
            raise TestbedError(f"runtime.testbed needs tc to shape {dev}: {reason}; {FIX}")
        handle = f"{0xC000 + os.getpid() % 0x3000:x}:"  # one per process, clear of tc's auto handles (8001:..)
        shaper = cls(dev, netns, handle)
        links = json.loads(_run(shaper._argv("ip", "-j", "link", "show", "dev", dev), f"no interface {dev}") or "[]")
        mtu = int(links[0].get("mtu", 0)) if links else 0
        if burst_bytes < mtu:
            raise TestbedError(
                f"tc shaper burst_bytes={burst_bytes} is below {dev}'s MTU {mtu}: such packets would never pass; "
                f"use burst_bytes >= {mtu} or a smaller MTU"
            )
        cmd = shaper._argv("tc", "qdisc", "add", "dev", dev, "root", "handle", handle, *args)
        _run(cmd, f"cannot shape {dev} (a root qdisc already there? `tc qdisc show dev {dev}`)")
        return shaper

    def read_back(self) -> TbfSettings:
        """The tbf's settings as the kernel holds them; TestbedError when it is gone."""
        out = _run(self._argv("tc", "-j", "qdisc", "show", "dev", self.dev), f"cannot read {self.dev}'s qdisc")
        settings = parse_tbf(out)
        if settings is None or self._removed:
            raise TestbedError(f"{self.dev} has no tbf root qdisc now (removed?); apply a new shaper")
        return settings

    def remove(self) -> None:
        """Delete the tbf root qdisc this shaper added (the default qdisc comes back); idempotent, and
        leaves alone a root qdisc someone else put there meanwhile or an interface that is gone."""
        if self._removed:
            return
        self._removed = True
        try:
            out = _run(self._argv("tc", "-j", "qdisc", "show", "dev", self.dev), f"cannot read {self.dev}'s qdisc")
        except TestbedError:
            return  # the interface (or its namespace) is gone, and the qdisc with it
        ours = any(q.get("root") and q.get("handle") == self.handle for q in json.loads(out or "[]"))
        if ours:
            _run(self._argv("tc", "qdisc", "del", "dev", self.dev, "root"), f"cannot unshape {self.dev}")

    def __repr__(self) -> str:
        where = f" in netns {self.netns}" if self.netns else ""
        return f"TcShaper({self.dev}{where}, handle {self.handle}{', removed' if self._removed else ''})"
