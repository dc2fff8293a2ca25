"""The task options that name data files: their checks and reading a split from them, written once for
every task (one-line errors naming the key)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks.data_files import resolve_file

Example = TypeVar("Example")

# The file options of a task that reads one file a split (``<split>_file``) and a BERT vocab.
SPLIT_FILE_KEYS = frozenset({"train_file", "val_file", "test_file", "extra_train_files", "vocab_file"})
REQUIRED_SPLIT_FILES = ("train_file", "val_file", "vocab_file")


def require_file_options(options: Mapping[str, Any], keys: Sequence[str], noun: str = "file") -> None:
    """Each of ``keys`` names a file; a ConfigError on the first empty one."""
    for key in keys:
        if not options.get(key):
            raise ConfigError(f"task.{key} is empty; name the {noun} (relative to data_dir)")


def require_file_list(options: Mapping[str, Any], example: str = "") -> None:
    """``extra_train_files`` is a list (absent = empty); ``example`` is shown in the error."""
    if not isinstance(options.get("extra_train_files", []), (list, tuple)):
        hint = f" (e.g. {example})" if example else ""
        raise ConfigError(f"task.extra_train_files must be a list of file names{hint}")


def require_test_files(split: str, options: Mapping[str, Any], keys: Sequence[str]) -> None:
    """The test split is read only from files named explicitly (``keys``, e.g. ``test_file``)."""
    if split == "test" and not all(options.get(key) for key in keys):
        named = " ".join(f"task.{key}=<file>" for key in keys)
        raise DataFormatError(f"no test split configured; pass {named} explicitly")


def read_file_split(
    data_dir: Path,
    options: Mapping[str, Any],
    split: str,
    what: str,
    read: Callable[[Path], Iterable[Example]],
    corpus_sizes: list[int] | None = None,
) -> list[Example]:
    """The examples of ``<split>_file`` (plus ``extra_train_files`` for train), each file read by ``read``;
    ``what`` names the dataset in the errors (e.g. "NER"). ``corpus_sizes`` (optional) gets the number of
    examples each file gave, in order: the corpora of ``task.partition: domain``."""
    require_test_files(split, options, ("test_file",))
    examples = list(read(resolve_file(data_dir, options.get(f"{split}_file") or "", f"{what} {split}")))
    sizes = [len(examples)]
    if split == "train":
        for extra in options.get("extra_train_files") or []:
            examples.extend(read(resolve_file(data_dir, extra, f"{what} extra train")))
            sizes.append(len(examples) - sum(sizes))
    if corpus_sizes is not None:
        corpus_sizes[:] = sizes
    return examples
