"""What the tasks read: the file groups each task's config names (``conf/task/<name>.yaml``), composed and
parsed as every entry point does, and where those names lie in a data folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from collapipe_flwr.config import CONF_DIR, compose
from collapipe_flwr.tasks.base import SPLITS
from collapipe_flwr.tasks.classification import CLASS_NAMES
from collapipe_flwr.tasks.spec import TaskSpec, parse_task

PROG = "python -m collapipe_flwr.data"
# The format of each task's data files (a task not listed here gets the plain non-empty text check).
FILE_KINDS = {"translation": "parallel", "ner": "bio", "classification": "titles"}


@dataclass(frozen=True)
class FileGroup:
    """Files read together: one file, or a translation source + target pair (line-aligned)."""

    task: str
    split: str  # train | val | test | extra | vocab
    names: tuple[str, ...]  # as configured: relative to the data folder (or absolute)
    kind: str  # parallel | bio | titles | vocab | text
    num_labels: int = len(CLASS_NAMES)


def task_names() -> list[str]:
    """The tasks configured in ``conf/task/*.yaml``."""
    return sorted(path.stem for path in (CONF_DIR / "task").glob("*.yaml"))


@lru_cache(maxsize=8)
def task_spec(name: str) -> TaskSpec:
    """The ``task`` section of ``task=<name>``, composed and parsed as every entry point does."""
    return parse_task(compose([f"task={name}"])["task"])


def file_groups(spec: TaskSpec) -> list[FileGroup]:
    """The files ``spec`` names: ``<split>_src``/``<split>_tgt`` pairs, ``<split>_file``, ``extra_train_files``
    and ``vocab_file`` (a test split only when named)."""
    options, kind = spec.options, FILE_KINDS.get(spec.name, "text")
    labels = options.get("num_labels", len(CLASS_NAMES))
    groups: list[FileGroup] = []

    def add(split: str, names: tuple[str, ...], group_kind: str) -> None:
        groups.append(FileGroup(spec.name, split, names, group_kind, labels))

    for split in SPLITS:
        src, tgt = options.get(f"{split}_src") or "", options.get(f"{split}_tgt") or ""
        if src or tgt:
            add(split, (str(src), str(tgt)), "parallel" if kind == "parallel" else "text")
        if options.get(f"{split}_file"):
            add(split, (str(options[f"{split}_file"]),), kind)
    for name in options.get("extra_train_files") or []:
        add("extra", (str(name),), kind)
    if options.get("vocab_file"):
        add("vocab", (str(options["vocab_file"]),), "vocab")
    return groups


def data_path(data_dir: Path, name: str) -> Path:
    """A configured file name as a path: relative to ``data_dir``, or absolute."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else data_dir / path


def is_relative(name: str) -> bool:
    """Whether a configured name lies inside the data folder (absolute names are outside any layout)."""
    return bool(name) and not Path(name).expanduser().is_absolute()


def needed_names(tasks: Sequence[str]) -> list[str]:
    """The data-folder-relative names the tasks read (absolute names are outside any layout)."""
    names = [name for task in tasks for group in file_groups(task_spec(task)) for name in group.names]
    return [name for name in dict.fromkeys(names) if is_relative(name)]
