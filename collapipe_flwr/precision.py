"""Compute precision of the forward passes: fp32, or bf16 autocast where the hardware runs it natively.

``runtime.precision`` (and ``--precision`` of the command-line tools) is ``auto``, ``fp32`` or ``bf16``.
:func:`resolve_precision` turns it into ``fp32`` or ``bf16``: ``auto`` picks bf16 only on a CPU with
AVX512-BF16 or AMX (or a CUDA GPU with bf16), because elsewhere bf16 matmuls are emulated and much slower
than fp32. :func:`autocast` is the context the forward passes run under; weights, gradients and
optimizer state stay fp32 either way.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from enum import StrEnum
from pathlib import Path

import torch

from collapipe_flwr.errors import ConfigError


class Precision(StrEnum):
    """``runtime.precision`` / ``--precision``: the forward passes' compute precision (``auto`` resolves to one
    of the other two, :func:`resolve_precision`)."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"


PRECISIONS = tuple(Precision)
CPUINFO = Path("/proc/cpuinfo")
NATIVE_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
_warned: set[str] = set()


def _cpu_flags() -> set[str] | None:
    """The CPU feature flags of the first ``flags`` line of /proc/cpuinfo, None when there is none.

    Read directly on purpose: psutil (used for processes, collapipe_flwr.experiments.processes) has no
    CPU-flag API, and torch only answers through a private op (:func:`_mkldnn_bf16`, the fallback).
    """
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def _mkldnn_bf16() -> bool:
    """oneDNN's own answer (used when /proc/cpuinfo cannot tell)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(check()) if check is not None else False
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def native_bf16(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` ("cpu" or "cuda") runs bfloat16 matmuls natively (cached per process)."""
    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type != "cpu":
        raise ConfigError(f"device type {device_type!r} is not supported for precision checks; use cpu or cuda")
    flags = _cpu_flags()
    if flags is None:
        return _mkldnn_bf16()
    return any(flag in flags for flag in NATIVE_CPU_FLAGS)


def resolve_precision(name: str, device_type: str = "cpu") -> Precision:
    """``auto`` | ``fp32`` | ``bf16`` -> ``fp32`` or ``bf16`` (warns once when bf16 would be emulated)."""
    try:
        precision = Precision(name)
    except ValueError:
        raise ConfigError(
            f"precision={name!r} is not one of {', '.join(PRECISIONS)}; pick auto (bf16 where native), fp32 or bf16"
        ) from None
    if precision is Precision.FP32:
        return precision
    native = native_bf16(device_type)
    if precision is Precision.AUTO:
        return Precision.BF16 if native else Precision.FP32
    if not native and device_type not in _warned:
        _warned.add(device_type)
        hardware = "CPU without AVX512-BF16/AMX" if device_type == "cpu" else f"{device_type} device without bf16"
        warnings.warn(
            f"precision=bf16 on this {hardware} is emulated and typically 10-17x slower than fp32; "
            "use precision=auto or precision=fp32",
            RuntimeWarning,
            stacklevel=2,
        )
    return Precision.BF16


def autocast(precision: str, device_type: str = "cpu"):
    """The forward-pass context: ``torch.autocast`` to bfloat16 for ``bf16``, nothing for ``fp32``."""
    if precision == Precision.BF16:
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision == Precision.FP32:
        return contextlib.nullcontext()
    raise ConfigError(f"precision={precision!r} is not resolved; pass fp32 or bf16 (resolve_precision maps auto)")
