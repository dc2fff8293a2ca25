"""heap_trim: freed heap pages go back to the kernel, read from the process's own resident set (/proc, not the
module's return value)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from collapipe_flwr.heap_trim import trim_heap

pytestmark = pytest.mark.e2e

glibc = pytest.mark.skipif(trim_heap() is None, reason="malloc_trim is glibc's; this C library has none")

# A fresh interpreter: raise glibc's dynamic mmap threshold by freeing one 8 MiB mmapped block, then take 160 blocks
# of 1 MiB from the heap (touched, so resident), free all but the last (which pins the heap's top, so free() itself
# cannot shrink it), and print the resident MiB before and after the call under test.
_CHILD = textwrap.dedent(
    """
    import ctypes, sys
    from collapipe_flwr.heap_trim import trim_heap
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    big = libc.malloc(8 << 20); ctypes.memset(big, 1, 8 << 20); libc.free(big)
    blocks = [libc.malloc(1 << 20) for _ in range(160)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[:-1]:
        libc.free(b)
    before = rss_mib()
    done = trim_heap() if sys.argv[1] == "trim" else None
    print(before, rss_mib(), done is not None and done.released)
    """
)


def _run(mode: str) -> tuple[float, float, bool]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True, timeout=60)
    before, after, released = out.stdout.split()
    return float(before), float(after), released == "True"


@glibc
def test_trim_returns_the_freed_heap_pages():
    before, after, released = _run("trim")
    assert released
    assert before - after > 100, f"resident {before:.0f} -> {after:.0f} MiB: the 159 freed MiB stayed"


@glibc
def test_without_the_trim_the_freed_heap_stays_resident():
    """The reference: the same frees without the call leave the pages resident (so the test above can fail)."""
    before, after, _ = _run("none")
    assert abs(before - after) < 5
    assert before > 150
