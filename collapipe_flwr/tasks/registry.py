"""Tasks by name: ``task.name`` -> the module ``collapipe_flwr.tasks.<name>`` and its ``TASK`` class.

Adding a fourth task is one module that defines ``TASK`` (a :class:`~collapipe_flwr.tasks.base.Task`
subclass) plus one ``conf/task/<name>.yaml``; nothing here changes. ``TASKS`` is a read-only mapping that
finds those modules on demand.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.base import Task

if TYPE_CHECKING:  # spec.py imports this module (parse_task looks up the task's class)
    from collapipe_flwr.tasks.spec import ModelSpec, TaskSpec

_PACKAGE = "collapipe_flwr.tasks"
_NOT_TASKS = {"base", "registry", "spec"}


class _TaskRegistry(Mapping):
    """name -> Task subclass, for every module of this package that defines ``TASK``."""

    def __getitem__(self, name: str) -> type[Task]:
        if not isinstance(name, str) or not name.isidentifier() or name in _NOT_TASKS:
            raise KeyError(name)
        try:
            module = importlib.import_module(f"{_PACKAGE}.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"{_PACKAGE}.{name}":
                raise KeyError(name) from None
            raise
        task = getattr(module, "TASK", None)
        if not (isinstance(task, type) and issubclass(task, Task) and task.name == name):
            raise KeyError(name)
        return task

    def __iter__(self) -> Iterator[str]:
        folder = Path(__file__).resolve().parent
        for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
            if info.name in _NOT_TASKS or info.ispkg:
                continue
            try:
                self[info.name]
            except KeyError:
                continue
            yield info.name

    def __len__(self) -> int:
        return sum(1 for _ in self)


TASKS: Mapping[str, type[Task]] = _TaskRegistry()


def task_class(name: Any) -> type[Task]:
    """The Task class of ``task.name``; a one-line ConfigError when none has that name."""
    if not name:
        raise ConfigError("task.name is missing; pick task=<translation|ner|classification|causal_lm>")
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(f"task.name={name!r} is not a known task; pick one of {', '.join(TASKS)}") from None


def build_task(task: TaskSpec, model: ModelSpec, data_dir: Path, seed: int, cache_dir: Path | None = None) -> Task:
    """The configured task over the files in ``data_dir`` (nothing is read until first used)."""
    return task_class(task.name)(task, model, data_dir, seed, cache_dir)
