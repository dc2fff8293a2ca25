"""A thread-safe token bucket that paces byte transfers to a link rate, plus an emulated per-transfer latency.

The emulated edge testbed runs devices on one box, where a loopback transfer is as fast as memory; to make a
transfer take the time it would take on the emulated link, the sender calls :meth:`TokenBucket.consume`
with the transfer's size before (or after) the real send. Tokens are bytes: they accrue at
``rate_bytes_per_s`` up to ``burst_bytes``, and a transfer of ``nbytes`` takes ``nbytes`` tokens. The
bucket may go into debt: a transfer larger than what is in the bucket (even larger than the burst) is
admitted at once and its caller sleeps until the debt is paid, so it takes ``(nbytes - tokens) / rate``
overall, and the transfers after it wait behind the debt. Reserving under the lock and sleeping outside it
keeps threads that share one bucket (one link) at the set rate together, served in arrival order.

``latency_s`` is a fixed delay added to every transfer in the caller's thread (outside the lock, so
concurrent transfers overlap as they would on a link with a propagation delay): ``tc netem`` does not work
on every kernel this testbed runs on.

Written by hand: the pacing is a dozen lines, and no library kept in this project holds a blocking,
thread-safe byte token bucket. The arithmetic is in the pure functions :func:`refill_bytes` and
:func:`throttle_seconds`, so it is tested without a clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from collapipe_flwr.errors import TestbedError


def is_unlimited(rate_bytes_per_s: float) -> bool:
    """A rate <= 0 or infinite means no pacing at all."""
    return rate_bytes_per_s <= 0 or math.isinf(rate_bytes_per_s)


def refill_bytes(tokens_bytes: float, elapsed_s: float, rate_bytes_per_s: float, burst_bytes: float) -> float:
    """Tokens after ``elapsed_s`` seconds of accrual at ``rate_bytes_per_s``, capped at ``burst_bytes``
    (a debt, i.e. negative tokens, is paid off first)."""
    return min(burst_bytes, tokens_bytes + max(0.0, elapsed_s) * rate_bytes_per_s)


def throttle_seconds(tokens_bytes: float, nbytes: float, rate_bytes_per_s: float) -> float:
    """Seconds a transfer of ``nbytes`` must wait when the bucket holds ``tokens_bytes`` (0 when unlimited)."""
    if is_unlimited(rate_bytes_per_s):
        return 0.0
    return max(0.0, nbytes - tokens_bytes) / rate_bytes_per_s


class TokenBucket:
    """Paces transfers to ``rate_bytes_per_s`` with bursts up to ``burst_bytes``; see the module docstring.

    The bucket starts full. ``clock`` and ``sleep`` are ``time.monotonic`` and ``time.sleep`` unless a
    test gives others.
    """

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst_bytes: float,
        latency_s: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        for key, value in (("rate_bytes_per_s", rate_bytes_per_s), ("burst_bytes", burst_bytes)):
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise TestbedError(f"token bucket {key}={value!r} must be a number")
        if not isinstance(latency_s, int | float) or not math.isfinite(latency_s) or latency_s < 0:
            raise TestbedError(f"token bucket latency_s={latency_s!r} must be a finite number of seconds >= 0")
        self.unlimited = is_unlimited(rate_bytes_per_s)
        if not self.unlimited and not (0 < burst_bytes < math.inf):
            raise TestbedError(
                f"token bucket burst_bytes={burst_bytes!r} must be finite and > 0 with a rate of "
                f"{rate_bytes_per_s} bytes/s (e.g. 64 KiB); use rate_bytes_per_s=0 for no limit"
            )
        self.rate_bytes_per_s = math.inf if self.unlimited else float(rate_bytes_per_s)
        self.burst_bytes = float(burst_bytes)
        self.latency_s = float(latency_s)
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.burst_bytes
        self._stamp = clock()

    def reserve(self, nbytes: float) -> float:
        """Take ``nbytes`` tokens now (going into debt if needed) and return the seconds the caller must wait
        before the bytes may pass, the latency included; does not sleep."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int | float) or not (0 <= nbytes < math.inf):
            raise TestbedError(f"token bucket nbytes={nbytes!r} must be a finite number >= 0")
        if self.unlimited:
            return self.latency_s
        with self._lock:
            now = self._clock()
            self._tokens = refill_bytes(self._tokens, now - self._stamp, self.rate_bytes_per_s, self.burst_bytes)
            self._stamp = now
            wait = throttle_seconds(self._tokens, nbytes, self.rate_bytes_per_s)
            self._tokens -= nbytes
        return wait + self.latency_s

    def consume(self, nbytes: float) -> float:
        """Block until ``nbytes`` may pass at the set rate (plus the fixed latency); returns the seconds slept."""
        wait = self.reserve(nbytes)
        if wait > 0:
            self._sleep(wait)
        return wait

    def tokens_bytes(self) -> float:
        """The tokens in the bucket now (negative = a debt later transfers wait behind); inf when unlimited."""
        if self.unlimited:
            return math.inf
        with self._lock:
            return refill_bytes(self._tokens, self._clock() - self._stamp, self.rate_bytes_per_s, self.burst_bytes)

    def __repr__(self) -> str:
        rate = "unlimited" if self.unlimited else f"{self.rate_bytes_per_s:g} B/s, burst {self.burst_bytes:g} B"
        return f"TokenBucket({rate}, latency {self.latency_s:g} s)"
