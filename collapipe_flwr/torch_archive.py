"""Sizes a ``torch.save`` archive claims, bounded before anything of that size is allocated.

``torch.load(weights_only=True)`` runs no code from a file, but it builds what the file describes: a tensor of
one float64 expanded (stride 0) to 2^32 elements is 8 bytes on disk and 32 GiB once anything copies it; a sparse
tensor is as small until it is made dense; a compressed record (a zip bomb) is a few KB that inflate to
gigabytes. So an archive is checked before torch reads it, and its tensors before anything uses them:

- :func:`check_archive`, the archive's directory: every record stored as ``torch.save`` writes it (a compressed
  one is refused before it is inflated), none claiming more bytes than the file holds, the pickle of plain
  values under :data:`PICKLE_LIMIT`;
- then ``torch.load(..., weights_only=True, mmap=True)`` (tensors map the file; nothing is read into memory)
  and :func:`unbounded` on each tensor :func:`walk_tensors` finds: dense, its storage holding every element it
  claims (no stride 0, no storage smaller than its elements) and no larger than the file; nesting at most
  :data:`MAX_DEPTH` deep (walked without recursion).

Used by the server's ``checkpoint.pt`` (fl/server/checkpoint.py, which then holds every tensor to the run's
shapes: fl/server/checkpoint_fit.py) and a BERT folder's ``pytorch_model.bin`` (models/bert.py). A refusal is
one :class:`ConfigError` line naming the file and the record or tensor.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from collapipe_flwr.errors import ConfigError

PICKLE_LIMIT = 256 << 20  # data.pkl holds plain values (queues, profiles, random states): a few KB to a few MB
MAX_DEPTH = 32  # a checkpoint nests 6 deep at most; a pickle nested 100,000 deep is refused, not recursed into
AFRESH = "start the run afresh"


def refused(path: Path, reason: str, fix: str = AFRESH) -> ConfigError:
    return ConfigError(f"{path} is not a checkpoint this run can use: {reason}; {fix}")


def check_archive(path: Path, fix: str = AFRESH) -> None:
    """The archive's directory, read before torch reads a record: every record stored uncompressed (torch.save
    compresses none), none larger than the file, the pickle at most :data:`PICKLE_LIMIT` bytes. A refusal is
    one ConfigError line ending with ``fix``."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0][:100]
        raise ConfigError(
            f"cannot read the checkpoint {path} ({type(err).__name__}: {first}): it is truncated or damaged; {fix}"
        ) from None
    total = 0
    for record in records:
        name = record.filename[:100]
        if record.compress_type != zipfile.ZIP_STORED:
            reason = f"its record {name} is compressed, which torch.save never does (it could inflate to any size)"
            raise refused(path, reason, fix)
        if max(record.file_size, record.compress_size) > size:
            raise refused(
                path, f"its record {name} claims {record.file_size} bytes, larger than the file ({size})", fix
            )
        if name.endswith("data.pkl") and record.file_size > PICKLE_LIMIT:
            reason = f"its record {name} holds {record.file_size} bytes of plain values (at most {PICKLE_LIMIT})"
            raise refused(path, reason, fix)
        total += record.file_size
    if total > size:
        raise refused(path, f"its records claim {total} bytes in all, larger than the file ({size})", fix)


def walk_tensors(value: Any, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor in ``value`` (dicts, lists, tuples) with its dotted place; iterative, and deeper nesting
    than :data:`MAX_DEPTH` is refused (a crafted pickle can nest 100,000 deep)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            yield where, item
            continue
        if isinstance(item, Mapping):
            children = list(item.items())
        elif isinstance(item, (list, tuple)):
            children = list(enumerate(item))
        else:
            continue
        if depth >= MAX_DEPTH:
            raise refused(path, f"its value at {where[:100]} nests deeper than {MAX_DEPTH} levels")
        for key, child in reversed(children):
            stack.append((child, f"{where}.{str(key)[:60]}" if where else str(key)[:60], depth + 1))


def unbounded(tensor: torch.Tensor, file_size: int) -> str | None:
    """Why ``tensor`` claims more than a file of ``file_size`` bytes holds (sparse, expanded, a storage smaller
    than its elements or larger than the file); None when it is bounded."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        return f"is {tensor.layout} (sparse or packed), not a dense tensor"
    nbytes = tensor.untyped_storage().nbytes()
    if nbytes > file_size:
        return f"has a storage of {nbytes} bytes, larger than the file ({file_size})"
    numel = tensor.numel()
    if numel == 0:
        return None
    if any(stride == 0 and n > 1 for n, stride in zip(tensor.shape, tensor.stride())):
        return f"is expanded (stride 0): {numel} elements over a storage of {nbytes} bytes"
    item = tensor.element_size()
    span = (tensor.storage_offset() + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1) * item
    if numel * item > nbytes or span > nbytes:
        return f"claims {numel * item} bytes over a storage of {nbytes} (expanded or overlapping)"
    return None


def materialized(value: Any) -> Any:
    """``value`` with every tensor copied out of the file's mapping; call it once every size is known to be
    bounded (the checkpoint: after fl/server/checkpoint_fit.py's ``check_fits``, when they are the run's own)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: materialized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(materialized(v) for v in value)
    return value
