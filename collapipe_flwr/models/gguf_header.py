"""The architecture of a GGUF file (``model.gguf_file``) read from its header, as the config.json keys of its
model type, so a config is checked without transformers or the weights (``hf_arch.folder_sizes`` reads it).

A GGUF file starts with ``GGUF``, a version, the tensor count, the metadata count and the metadata (key, type,
value); the architecture is ``general.architecture`` and the sizes ``<arch>.embedding_length``,
``<arch>.attention.head_count``, ``<arch>.feed_forward_length``, ``<arch>.block_count``,
``<arch>.context_length`` (what transformers' own GGUF loader maps to the same config keys). Only the metadata is
read; the tokenizer's arrays are skipped. Every count and length the file states is checked against the bytes
left before it is used, and arrays nest at most 8 deep (a damaged file is one line, never a RecursionError).
The weights load with transformers (``from_pretrained(folder, gguf_file=...)``, dequantised,
models/hf/loading.py).

Why by hand, beside the ``gguf`` package's ``GGUFReader``: the config is parsed at every start-up (the launcher,
the ServerApp, each CU), and ``GGUFReader`` maps every tensor and every tokenizer array of the file: 3.0 s for
SmolLM2's 98 MB file here (loaded machine), against 13 ms for this reader that stops at the metadata.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from collapipe_flwr.errors import ConfigError

# GGUF metadata value types: (struct format, size) of the fixed-size ones; 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# GGUF architecture -> Hugging Face model type (those the splitter cuts)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral", "gpt2": "gpt2"}
# project size -> GGUF key under "<arch>."
SIZE_KEYS = {
    "hidden": "embedding_length",
    "n_heads": "attention.head_count",
    "d_ff": "feed_forward_length",
    "layers": "block_count",
    "max_len": "context_length",
}


MAX_DEPTH = 8  # metadata arrays nested deeper than this are refused (GGUF's own arrays are 1 or 2 deep)


class _Reader:
    """Reads GGUF metadata from the bytes ``data``: every count and length is checked against the bytes left
    before it is used (a ValueError naming it), and arrays nest at most :data:`MAX_DEPTH` deep."""

    def __init__(self, data: Any) -> None:
        self.data, self.size = data, len(data)

    def need(self, at: int, count: int, each: int, what: str) -> None:
        """``count`` items of at least ``each`` bytes fit in the file from ``at``, else a ValueError."""
        if count * each > self.size - at:
            raise ValueError(f"{what} of {count} at byte {at} is longer than the file ({self.size} bytes)")

    def u64(self, at: int) -> int:
        self.need(at, 1, 8, "a length")
        return struct.unpack_from("<Q", self.data, at)[0]

    def string(self, at: int) -> tuple[str, int]:
        length = self.u64(at)
        self.need(at + 8, length, 1, "a string")
        return bytes(self.data[at + 8 : at + 8 + length]).decode("utf-8", "replace"), at + 8 + length

    def skip_strings(self, at: int, n: int) -> int:
        """The position after ``n`` strings from ``at`` (each length checked against the file's end)."""
        length, data, size = struct.Struct("<Q").unpack_from, self.data, self.size
        for _ in range(n):
            if at + 8 > size:
                break
            at += 8 + length(data, at)[0]
        if at > size:
            raise ValueError(f"an array of {n} strings runs past the end of the file ({size} bytes)")
        return at

    def skip(self, kind: int, at: int, depth: int = 0) -> int:
        """The position after a value of type ``kind`` at ``at`` (arrays: nested at most MAX_DEPTH deep)."""
        if kind in _SCALARS:
            self.need(at, 1, struct.calcsize(_SCALARS[kind]), "a value")
            return at + struct.calcsize(_SCALARS[kind])
        if kind == _STRING:
            return self.string(at)[1]
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        if depth >= MAX_DEPTH:
            raise ValueError(f"its metadata arrays nest deeper than {MAX_DEPTH}")
        self.need(at, 1, 12, "an array header")
        item, n = struct.unpack_from("<IQ", self.data, at)
        at += 12
        # the least bytes one item takes: a scalar's size, a string's length, an array's type and count
        least = struct.calcsize(_SCALARS[item]) if item in _SCALARS else 8 if item == _STRING else 12
        self.need(at, n, least, "an array")
        if item in _SCALARS:
            return at + n * least
        if item == _STRING:  # the tokenizer's tokens and merges: lengths only, in a tight loop
            return self.skip_strings(at, n)
        for _ in range(n):
            at = self.skip(item, at, depth + 1)
        return at


def _read_metadata(data: Any) -> dict[str, Any]:
    """{key: value} of the header's scalar and string metadata (arrays skipped) of the bytes ``data``."""
    if bytes(data[:4]) != b"GGUF":
        raise ValueError("no GGUF magic")
    reader = _Reader(data)
    reader.need(0, 1, 24, "the header")
    _version, _tensors, count = struct.unpack_from("<IQQ", data, 4)
    pos = 24
    if count * 12 > reader.size - pos:  # a record is at least a key's length and a value type
        raise ValueError(f"it claims {count} metadata records, more than its {reader.size} bytes hold")
    out: dict[str, Any] = {}
    for _ in range(count):
        key, pos = reader.string(pos)
        reader.need(pos, 1, 4, "a value type")
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if kind in _SCALARS:
            reader.need(pos, 1, struct.calcsize(_SCALARS[kind]), "a value")
            (out[key],) = struct.unpack_from(_SCALARS[kind], data, pos)
        elif kind == _STRING:
            out[key] = reader.string(pos)[0]
        pos = reader.skip(kind, pos)
    return out


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The scalar and string metadata of the GGUF file ``path`` (one-line ConfigError when it is not one)."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read_metadata(data)
    except (OSError, ValueError, struct.error, IndexError) as err:
        raise ConfigError(
            f"model.gguf_file: cannot read {path} as a GGUF file ({err.__class__.__name__}: {str(err)[:80]}); "
            "the file is damaged or not GGUF"
        ) from None


def gguf_config(path: str | Path) -> dict[str, Any]:
    """The config.json keys (``model_type`` + the sizes in the type's own words) of the GGUF file ``path``."""
    from collapipe_flwr.models.hf_arch import CONFIG_KEYS

    meta = gguf_metadata(path)
    arch = str(meta.get("general.architecture", ""))
    model_type = ARCHITECTURES.get(arch)
    if model_type is None or model_type not in CONFIG_KEYS:
        raise ConfigError(
            f"model.gguf_file: {Path(path).name} holds a {arch or '(no architecture)'!r} model; GGUF files of "
            f"{', '.join(ARCHITECTURES)} load here"
        )
    config: dict[str, Any] = {"model_type": model_type}
    for size, key in SIZE_KEYS.items():
        if f"{arch}.{key}" in meta:
            config[CONFIG_KEYS[model_type][size]] = meta[f"{arch}.{key}"]
    if model_type == "gpt2" and "n_inner" not in config:
        config["n_inner"] = None  # folder_sizes: 4 n_embd
    return config
