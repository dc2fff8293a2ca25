"""Files replaced in one step, and I/O errors as one line.

Every file a run keeps (config.json, summary.json, checkpoint.pt, a CU's optimizer moments, saved models,
plots, the launcher's status.json and run_config.toml) is written through :func:`replace_atomically`: a reader
sees the old file or the new one, never a part, and a crash or a full disk leaves the old file in place. Written
here rather than taken from a library because the error contract is the project's: an ``OSError`` (disk full,
no permission) becomes a one-line ``CollaPipeError`` naming the file and what to do.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from collapipe_flwr.errors import CollaPipeError


@contextmanager
def file_errors(path: Path, doing: str, error: type[CollaPipeError] = CollaPipeError) -> Iterator[None]:
    """OSError -> one-line ``error`` (a CollaPipeError) naming the file and what to do."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise error(
            f"cannot {doing} {path}: {reason}; free disk space or set output-dir to a folder you can write"
        ) from None


@contextmanager
def _temporary_replaced(tmp: str, writer_errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """The body fills ``tmp`` and moves it into place; on any failure ``tmp`` goes, and a writer's own error
    (torch.save reports a full disk as "[enforce fail at inline_container.cc]", safetensors as a SafetensorError)
    becomes an ENOSPC OSError, which :func:`file_errors` turns into the one line."""
    try:
        yield
    except writer_errors as err:
        Path(tmp).unlink(missing_ok=True)
        first = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise OSError(errno.ENOSPC, f"the writer failed ({first}); is the disk full?") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_atomically(
    path: Path, write: Callable[[BinaryIO], object], error: type[CollaPipeError] = CollaPipeError
) -> None:
    """Replace ``path`` in one step: ``write`` fills a temporary file in the same folder, which is synced and
    moved over ``path`` with ``os.replace`` (a reader sees the old file or the new one, never a part); a disk
    error is a one-line ``error``."""
    with file_errors(path, "write", error):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
        with _temporary_replaced(tmp, (RuntimeError,)):
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)


def replace_atomically_by_name(
    path: Path, write: Callable[[str], object], writer_errors: tuple[type[BaseException], ...] = (RuntimeError,)
) -> None:
    """:func:`replace_atomically` for a writer that takes a file name (safetensors' ``save_file``): the temporary
    file (mode 0o600) is named to ``write``, then synced and moved over ``path``; ``writer_errors`` are how the
    writer reports a full disk."""
    with file_errors(path, "write"):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
        os.close(fd)
        with _temporary_replaced(tmp, writer_errors):
            write(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)


def write_atomic(path: Path, text: str, error: type[CollaPipeError] = CollaPipeError) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; a disk error is a one-line ``error``."""
    replace_atomically(path, lambda fh: fh.write(text.encode("utf-8")), error)
