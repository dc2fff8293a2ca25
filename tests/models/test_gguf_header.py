"""The GGUF header reader (models/gguf_header.py) bounds what the file states before it trusts it (issue 67):
metadata arrays nested 100,000 deep (a RecursionError traceback before), arrays and strings longer than the
file, and a metadata count the file cannot hold are each one line naming the file. Files are written by hand."""

from __future__ import annotations

import struct
import time

import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.models.gguf_header import gguf_config

U32, STRING, ARRAY = 4, 8, 9


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _file(items: list[bytes], count: int | None = None) -> bytes:
    """A GGUF v3 file of no tensors and the key-value records ``items``."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(items) if count is None else count) + b"".join(items)


def _kv(key: str, kind: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + value


GPT2 = [
    _kv("general.architecture", STRING, _string("gpt2")),
    _kv("gpt2.embedding_length", U32, struct.pack("<I", 16)),
    _kv("gpt2.block_count", U32, struct.pack("<I", 2)),
]


def _refused(tmp_path, data: bytes, match: str) -> str:
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    with pytest.raises(ConfigError, match=match) as err:
        gguf_config(path)
    assert "\n" not in str(err.value) and "model.gguf" in str(err.value)
    return str(err.value)


def test_a_small_gguf_header_gives_the_sizes(tmp_path):
    path = tmp_path / "model.gguf"
    tokens = _kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 2) + _string("a") + _string("b"))
    path.write_bytes(_file([*GPT2, tokens]))
    config = gguf_config(path)
    assert config["model_type"] == "gpt2" and config["n_embd"] == 16 and config["n_layer"] == 2


def test_metadata_arrays_nested_100000_deep_are_one_line_not_a_recursion_error(tmp_path):
    depth = 100_000
    nested = struct.pack("<IQ", ARRAY, 1) * depth + struct.pack("<IQ", U32, 0)
    _refused(tmp_path, _file([*GPT2, _kv("x.nested", ARRAY, nested)]), "nest deeper than")


@pytest.mark.parametrize(
    "value, match",
    [
        (struct.pack("<IQ", U32, 2**62), "array of 4611686018427387904"),  # 2^64 bytes of u32
        (struct.pack("<IQ", STRING, 2**62), "array of 4611686018427387904"),
        (struct.pack("<IQ", ARRAY, 2**40) + struct.pack("<IQ", U32, 0), "array of 1099511627776"),
    ],
)
def test_arrays_longer_than_the_file_are_refused_at_once(tmp_path, value, match):
    start = time.monotonic()
    _refused(tmp_path, _file([*GPT2, _kv("x.big", ARRAY, value)]), match)
    assert time.monotonic() - start < 5  # refused from the count, not after looping over it


def test_a_string_or_a_count_longer_than_the_file_is_refused(tmp_path):
    _refused(tmp_path, _file([*GPT2, _kv("x.s", STRING, struct.pack("<Q", 2**63))]), "string of 9223372036854775808")
    _refused(tmp_path, _file(GPT2, count=2**63), "9223372036854775808 metadata records")
