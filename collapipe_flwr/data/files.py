"""Writing into a data folder: atomic replacement, and the refusals that keep existing data (a non-empty
file without ``--force``, a ``--dir`` that is a symlink to another folder)."""

from __future__ import annotations

import filecmp
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from collapipe_flwr.errors import ConfigError


def occupied(path: Path) -> bool:
    """Whether writing ``path`` would replace data: a non-empty file (or a link to one)."""
    if path.is_symlink() and not path.exists():
        return False  # a dangling link holds nothing
    if path.is_dir():
        raise ConfigError(f"{path} is a folder where a data file belongs; move it away")
    return path.is_file() and path.stat().st_size > 0


def refuse_conflicts(conflicts: Sequence[Path]) -> None:
    """A ConfigError naming the first of ``conflicts`` (files that would be overwritten), if any."""
    if conflicts:
        more = f" and {len(conflicts) - 1} more" if len(conflicts) > 1 else ""
        raise ConfigError(
            f"{conflicts[0]}{more} already exist(s) with other content; pass --force to overwrite, "
            "or choose another --dir"
        )


def refuse_linked(dest: Path) -> None:
    """Writing through a ``--dir`` that is a symlink (an earlier ``--link``) would change the linked folder."""
    if dest.is_symlink():
        raise ConfigError(
            f"--dir {dest} is a symlink to {dest.resolve()}; writing would change that folder: remove the link "
            f"(rm {dest}) or choose another --dir"
        )


def replace(path: Path, write: Callable[[Path], object]) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary name beside it, then it replaces ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
        try:
            write(Path(tmp))
            os.replace(tmp, path)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; check the folder's permissions") from None


def copy_of(source: Path) -> Callable[[Path], object]:
    """A writer for :func:`replace`: a copy of ``source``."""
    return lambda tmp: shutil.copyfile(source, tmp)


def link_to(source: Path) -> Callable[[Path], object]:
    """A writer for :func:`replace`: a symlink to ``source``."""
    return lambda tmp: tmp.symlink_to(source)


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """``lines`` as a UTF-8 text file with LF endings (atomically); the number of lines."""
    text = "".join(f"{line}\n" for line in lines)
    replace(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"))
    return text.count("\n")


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are the same file or hold the same bytes (False when either is unreadable)."""
    try:
        return a.resolve() == b.resolve() or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False
