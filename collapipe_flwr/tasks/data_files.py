"""Finding and reading the dataset files (docs/data.md) with one-line errors.

Files are read once per (path, size, mtime) through a pure cache: the same file read twice gives the
same tuple of lines, and an edited file is read again. Nothing here keeps mutable module state.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from collapipe_flwr.errors import DataFormatError

# control characters no text line holds (tab, LF and CR are fine): a file with them is binary or corrupt
_BINARY = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def resolve_file(data_dir: Path | str, name: str, what: str) -> Path:
    """``name`` (relative to ``data_dir`` or absolute) as an existing file, else a DataFormatError."""
    if not name:
        raise DataFormatError(f"no file configured for {what}; set it in conf/task (relative to data_dir)")
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = Path(data_dir) / path
    if not path.is_file():
        raise DataFormatError(
            f"{what} file {path} does not exist; check data_dir and the task's file names (see docs/data.md)"
        )
    return path


def text_lines(path: Path | str) -> tuple[str, ...]:
    """The lines of a UTF-8 text file without their line endings (cached by path, size and mtime)."""
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except OSError as err:
        raise DataFormatError(f"cannot read {path}: {err.strerror}; check the path") from None
    return _read_lines(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _read_lines(path: str, size: int, mtime_ns: int) -> tuple[str, ...]:
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise DataFormatError(f"cannot read {path}: {err.strerror}; check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataFormatError(f"{path}:{line}: not valid UTF-8; the datasets are plain UTF-8 text") from None
    text = text.removeprefix("\ufeff")
    binary = _BINARY.search(text)
    if binary is not None:
        line = text.count("\n", 0, binary.start()) + 1
        raise DataFormatError(
            f"{path}:{line}: control character {binary.group()!r} (binary data, e.g. NUL bytes); the datasets are "
            "plain text: restore the file from its source (docs/data.md)"
        )
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return tuple(line.rstrip("\r") for line in lines)
