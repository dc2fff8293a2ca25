"""``prepare --from SRC``: copy (or symlink) the files the tasks read from a folder already in the layout."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from collapipe_flwr.data.files import copy_of, link_to, occupied, refuse_conflicts, refuse_linked, replace, same_file
from collapipe_flwr.data.layout import PROG, needed_names
from collapipe_flwr.errors import ConfigError


def _require_files(src: Path, names: Sequence[str]) -> None:
    """The folder ``src`` holds every one of ``names``."""
    absent = [name for name in names if not (src / name).is_file()]
    if absent:
        raise ConfigError(
            f"--from {src} lacks {', '.join(absent)}; `{PROG} check --dir {src}` lists what it holds "
            "(layout: docs/data.md)"
        )


def _link_folder(src: Path, dest: Path) -> None:
    """``dest`` (which does not exist yet) becomes a symlink to the folder ``src``."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(src, target_is_directory=True)
    except OSError as err:
        raise ConfigError(f"cannot create the link {dest}: {err.strerror or err}") from None
    print(f"linked {dest} -> {src}")


def prepare_from(src: Path, dest: Path, tasks: Sequence[str], link: bool, force: bool) -> None:
    """Copy (or symlink) the files the tasks read from ``src``, a folder in the layout, into ``dest``."""
    src = src.expanduser().resolve()
    if not src.is_dir():
        raise ConfigError(f"--from {src} is not a folder; pass a data folder in the layout of docs/data.md")
    names = needed_names(tasks)
    _require_files(src, names)
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"--dir {dest} is a file, not a folder; choose another --dir")
    if dest.is_dir() and dest.resolve() == src:
        print(f"{dest} is {src} already; nothing to copy")
        return
    if link and not os.path.lexists(dest):
        _link_folder(src, dest)
        return
    refuse_linked(dest)
    todo = [name for name in names if not same_file(src / name, dest / name)]
    refuse_conflicts([dest / name for name in todo if not force and occupied(dest / name)])
    for name in todo:
        replace(dest / name, link_to(src / name) if link else copy_of(src / name))
    verb = "linked" if link else "copied"
    print(f"{verb} {len(todo)} file(s) from {src} into {dest} ({len(names) - len(todo)} already there)")
