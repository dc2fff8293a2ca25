"""collapipe_flwr.testbed.token_bucket: measured rates on the real clock (each well under a second), the debt
of a transfer larger than the burst, threads sharing one bucket, and the arithmetic on a fake clock."""

from __future__ import annotations

import math
import threading
import time

import pytest

from collapipe_flwr import errors
from collapipe_flwr.testbed.token_bucket import TokenBucket, refill_bytes, throttle_seconds

RATE = 4_000_000  # bytes/s
BURST = 65_536
CHUNK = 65_536


def _send(bucket: TokenBucket, total: int, chunk: int = CHUNK) -> None:
    sent = 0
    while sent < total:
        n = min(chunk, total - sent)
        bucket.consume(n)
        sent += n


def test_throttled_transfer_runs_at_the_set_rate():
    bucket = TokenBucket(RATE, BURST)
    start = time.monotonic()
    _send(bucket, 2_000_000)
    elapsed = time.monotonic() - start
    rate = (2_000_000 - BURST) / elapsed  # the first burst passes at once: the bucket starts full
    print(f"2 MB at 4 MB/s: {elapsed:.3f} s, rate {rate / 1e6:.3f} MB/s ({rate / RATE - 1:+.1%})")
    assert rate == pytest.approx(RATE, rel=0.15)


def test_one_transfer_larger_than_the_burst_takes_its_size_over_the_rate():
    bucket = TokenBucket(RATE, 100_000)
    start = time.monotonic()
    waited = bucket.consume(1_000_000)
    elapsed = time.monotonic() - start
    assert waited == pytest.approx((1_000_000 - 100_000) / RATE)
    assert elapsed == pytest.approx(0.225, rel=0.15)
    assert bucket.tokens_bytes() <= 100_000  # the debt is paid, not more


@pytest.mark.parametrize("rate", [0, -1, math.inf])
def test_unlimited_rate_returns_at_once(rate):
    bucket = TokenBucket(rate, 0)
    start = time.monotonic()
    for _ in range(100):
        assert bucket.consume(10**9) == 0
    assert time.monotonic() - start < 0.05
    assert bucket.unlimited and bucket.tokens_bytes() == math.inf


def test_two_threads_sharing_one_bucket_get_the_set_rate_together():
    bucket = TokenBucket(RATE, BURST)
    threads = [threading.Thread(target=_send, args=(bucket, 1_000_000, 32_768)) for _ in range(2)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)
    elapsed = time.monotonic() - start
    assert not any(thread.is_alive() for thread in threads)
    rate = (2_000_000 - BURST) / elapsed
    print(f"two threads, 1 MB each at 4 MB/s shared: {elapsed:.3f} s, rate {rate / 1e6:.3f} MB/s")
    assert rate == pytest.approx(RATE, rel=0.15)


def test_fixed_latency_is_added_to_each_transfer():
    bucket = TokenBucket(0, 0, latency_s=0.04)
    start = time.monotonic()
    for _ in range(3):
        assert bucket.consume(1_000) == pytest.approx(0.04)
    assert time.monotonic() - start == pytest.approx(0.12, abs=0.04)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_bucket_arithmetic_on_a_fake_clock():
    clock = FakeClock()
    bucket = TokenBucket(1_000, 500, latency_s=0.5, clock=clock, sleep=clock.sleep)
    assert bucket.consume(500) == 0.5  # from the full bucket: the latency only
    # The latency's sleep refilled 500 B; 2000 B leave a debt of 1500 B (1.5 s); reserve() does not sleep.
    assert bucket.reserve(2_000) == pytest.approx(1.5 + 0.5)
    assert bucket.reserve(100) == pytest.approx(1.6 + 0.5)  # queued behind the debt
    assert bucket.tokens_bytes() == -1_600
    clock.now += 10
    assert bucket.tokens_bytes() == 500  # capped at the burst
    assert clock.slept == [0.5]


def test_pure_helpers():
    assert throttle_seconds(100, 500, 1_000) == pytest.approx(0.4)
    assert throttle_seconds(1_000, 500, 1_000) == 0
    assert throttle_seconds(-500, 500, 1_000) == pytest.approx(1.0)
    assert throttle_seconds(0, 10**9, 0) == 0 and throttle_seconds(0, 10**9, math.inf) == 0
    assert refill_bytes(-200, 0.5, 1_000, 800) == 300
    assert refill_bytes(700, 5, 1_000, 800) == 800
    assert refill_bytes(700, -1, 1_000, 800) == 700


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_bytes_per_s": 1e6, "burst_bytes": 0}, "burst_bytes=0 must be finite and > 0"),
        ({"rate_bytes_per_s": 1e6, "burst_bytes": math.inf}, "burst_bytes=inf"),
        ({"rate_bytes_per_s": math.nan, "burst_bytes": 1}, "rate_bytes_per_s=nan must be a number"),
        ({"rate_bytes_per_s": 1e6, "burst_bytes": 1, "latency_s": -1}, "latency_s=-1"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, match):
    with pytest.raises(errors.TestbedError, match=match):
        TokenBucket(**kwargs)
    with pytest.raises(errors.TestbedError, match="nbytes=-1"):
        TokenBucket(1e6, 1e3).consume(-1)
