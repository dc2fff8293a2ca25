"""Give the C heap's free pages back to the kernel at a round's end (glibc's ``malloc_trim``), in every long-lived
process of a run: the ServerApp's, each CU's and each device actor's.

Why: PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves blocks of up to 32 MiB from its heaps
once a freed mmap-sized block has raised its dynamic mmap threshold, and keeps one heap (arena) per thread that
allocates. A process whose threads allocate and free activations, gradients and decoded frames round after round
(the decoder host's connection threads, a device's step calls) therefore keeps the freed pages: the memory is free
to ``malloc`` but still resident, so the process's PSS only grows. Measured on the default run (issue 64): the
ServerApp's process held 1589 MiB of anonymous memory in round 2 and 2739 MiB after round 4, and one
``malloc_trim(0)`` (called from gdb) brought it to 1295 and 1318 MiB, the same floor both times: the growth of
about 0.5 GiB a round was free heap, not live objects. A device actor with a segment gave back 75-140 MiB.

Why by hand: no kept library exposes ``malloc_trim`` (psutil reads memory, it does not release it); it is one libc
call through :mod:`ctypes`. Elsewhere (macOS, musl) nothing is called and ``None`` is returned.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Trimmed:
    """One ``malloc_trim(0)``: whether glibc gave any memory back (``released``) and the call's wall ``seconds``."""

    released: bool
    seconds: float


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim`` (``int malloc_trim(size_t pad)``), or None where the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries without it
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> Trimmed | None:
    """Return the free pages of every malloc arena of this process to the kernel (``malloc_trim(0)``: no pad kept
    at the top of the main heap). None where the C library is not glibc. Safe to call at any time from any thread:
    glibc locks each arena while it walks it."""
    trim = _malloc_trim()
    if trim is None:
        return None
    t0 = time.perf_counter()
    released = bool(trim(0))
    return Trimmed(released, time.perf_counter() - t0)
