"""The tensors of a safetensors file (name -> shape) read from its header alone, every size bounded by the file's.

A safetensors file is an 8-byte little-endian header length n, n bytes of JSON ({name: {dtype, shape,
data_offsets: [begin, end]}}, plus an optional ``__metadata__``), then the tensors' bytes. Nothing is allocated
from a size the file states until that size is checked against the file's own: a header longer than the file
(or than safetensors' own 100 MB limit), offsets past the end of the data, or a shape whose bytes differ from
its offsets is a one-line ConfigError naming the file (and the tensor), never a 2^63-byte read.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
MAX_DIMS = 16  # sizes in one tensor's shape (a longer list is refused before its product is taken)
# bytes per element of each safetensors dtype
ITEM_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "E8M0": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
_FIX = "the file is damaged or truncated; copy the model's weights again"


def _read_header(path: Path) -> tuple[Any, int]:
    """(the parsed JSON header, bytes of tensor data after it) of ``path``, its length checked first."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(8)
            if len(head) < 8:
                raise ConfigError(f"{path} is not a safetensors file ({size} bytes); {_FIX}")
            (length,) = struct.unpack("<Q", head)
            if length > min(MAX_HEADER_BYTES, size - 8):
                raise ConfigError(f"{path}: its header claims {length} bytes but the file holds {size}; {_FIX}")
            raw = file.read(length)
    except OSError as err:
        raise ConfigError(f"cannot read {path} ({err.__class__.__name__}); check the file's permissions") from None
    try:
        return json.loads(raw), size - 8 - length
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"{path}: not a safetensors header (its JSON does not parse); {_FIX}") from None


def _shape_of(path: Path, name: str, entry: Any, data_bytes: int) -> tuple[int, ...]:
    """The shape of one header entry, its dtype, shape and offsets checked against the ``data_bytes`` there are."""
    if not isinstance(entry, dict) or entry.get("dtype") not in ITEM_BYTES:
        raise ConfigError(f"{path}: tensor {name} has no known dtype; {_FIX}")
    shape: Any = entry.get("shape")
    offsets: Any = entry.get("data_offsets")
    ints = isinstance(shape, list) and len(shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in shape)
    pair = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
    if not (ints and pair and 0 <= offsets[0] <= offsets[1]):
        raise ConfigError(
            f"{path}: tensor {name} has no valid shape (at most {MAX_DIMS} sizes) and data_offsets; {_FIX}"
        )
    if offsets[1] > data_bytes:
        raise ConfigError(f"{path}: tensor {name} ends at byte {offsets[1]}, past the end of the file's data; {_FIX}")
    if math.prod(shape) * ITEM_BYTES[entry["dtype"]] != offsets[1] - offsets[0]:
        raise ConfigError(f"{path}: tensor {name} of shape {shape} does not fill its {offsets} bytes; {_FIX}")
    return tuple(shape)


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the safetensors file ``path`` (one-line ConfigError when the header is damaged)."""
    path = Path(path)
    header, data_bytes = _read_header(path)
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: not a safetensors header (not a JSON object); {_FIX}")
    return {
        str(name): _shape_of(path, str(name), entry, data_bytes)
        for name, entry in header.items()
        if name != "__metadata__"
    }
