"""``check``: whether a data folder holds every file the tasks read, each read by the task's own reader, so
a file ``check`` accepts is one training accepts; one line per task and an ``error: ...`` with the fix."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from collapipe_flwr.config import DATA_DIR_ENV, DEFAULT_DATA_DIR_NAME, resolve_data_dir
from collapipe_flwr.data.layout import PROG, FileGroup, data_path, file_groups, task_names, task_spec
from collapipe_flwr.errors import ConfigError, DataFormatError
from collapipe_flwr.tasks.bert_vocab import VOCAB_SPECIALS
from collapipe_flwr.tasks.classification import read_titles
from collapipe_flwr.tasks.data_files import text_lines
from collapipe_flwr.tasks.ner import read_bio
from collapipe_flwr.tasks.spec import TaskSpec
from collapipe_flwr.tasks.translation import read_parallel

UNITS = {"parallel": "pairs", "bio": "sentences", "titles": "titles", "vocab": "tokens", "text": "lines"}


@dataclass(frozen=True)
class TaskReport:
    task: str
    counts: tuple[tuple[str, int, str], ...] = ()  # (split, count, unit) of the files that are fine
    missing: tuple[str, ...] = ()  # configured names of absent files
    bad: tuple[str, ...] = ()  # one-line reasons

    @property
    def ok(self) -> bool:
        return not self.missing and not self.bad

    def line(self) -> str:
        if self.ok:
            counts = ", ".join(f"{split} {count:,} {unit}" for split, count, unit in self.counts)
            return f"{self.task}: ok ({counts})"
        parts = []
        if self.missing:
            parts.append("missing " + ", ".join(self.missing))
        parts.extend(f"bad {reason}" for reason in self.bad)
        return f"{self.task}: " + "; ".join(parts)


def _count(group: FileGroup, paths: Sequence[Path]) -> int:
    """The examples in a file group, read by the task's own reader; DataFormatError when malformed."""
    if group.kind == "parallel":
        return len(read_parallel(paths[0], paths[1]))
    if group.kind == "bio":
        return len(read_bio(paths[0]))
    if group.kind == "titles":
        return len(read_titles(paths[0], group.num_labels))
    lines = text_lines(paths[0])
    if not any(line.strip() for line in lines):
        return 0
    if group.kind == "vocab":
        absent = [token for token in VOCAB_SPECIALS if token not in {line.strip() for line in lines}]
        if absent:
            raise DataFormatError(
                f"{paths[0]} has no {', '.join(absent)} line; expected the bert-base-chinese vocab.txt "
                "(one WordPiece token a line)"
            )
    return len(lines)


def check_task(data_dir: Path, spec: TaskSpec) -> TaskReport:
    """Whether ``data_dir`` holds the files of ``spec`` in the right format."""
    counts: list[tuple[str, int, str]] = []
    missing: list[str] = []
    bad: list[str] = []
    for group in file_groups(spec):
        paths = [data_path(data_dir, name) for name in group.names]
        absent = [
            name or f"(no {group.split} file configured)"
            for name, path in zip(group.names, paths)
            if not name or not path.is_file()
        ]
        if absent:
            missing.extend(name for name in absent if name not in missing)
            continue
        try:
            count = _count(group, paths)
        except DataFormatError as err:
            bad.append(str(err))
            continue
        if count == 0:
            bad.append(f"{' / '.join(group.names)}: empty (no {UNITS[group.kind]}); restore it from its source")
            continue
        counts.append((group.split, count, UNITS[group.kind]))
    return TaskReport(spec.name, tuple(counts), tuple(missing), tuple(bad))


def default_check_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The folder the tasks would read: ``resolve_data_dir`` (``$COLLAPIPE_DATA_DIR``, else ``./data`` or
    ``data/`` beside conf/), else ``./data`` (or the variable's value when it names no folder)."""
    environ = os.environ if environ is None else environ
    try:
        return resolve_data_dir(None, environ)
    except ConfigError:
        value = environ.get(DATA_DIR_ENV, "")
        return Path(value).expanduser().resolve() if value else Path.cwd() / DEFAULT_DATA_DIR_NAME


def selected_tasks(tasks: Sequence[str] | None) -> list[str]:
    """The ``--task`` names (each a configured task), or every configured task when none is given."""
    known = task_names()
    for name in tasks or ():
        if name not in known:
            raise ConfigError(f"--task {name!r} is not a configured task; pick one of {', '.join(known)} (conf/task)")
    return list(tasks) if tasks else known


def _fetch_hint(data_dir: Path) -> str:
    return (
        f"run `{PROG} prepare --dir {data_dir} --from <folder in the layout>` (add --link to symlink) "
        f"or `{PROG} prepare --dir {data_dir} --from-hub` (docs/data.md)"
    )


def _problems(data_dir: Path, reports: Sequence[TaskReport]) -> list[str]:
    """The ``error: ...`` parts for what the reports found missing or malformed (none when all is fine)."""
    missing = list(dict.fromkeys(name for report in reports for name in report.missing))
    bad = [reason for report in reports for reason in report.bad]
    problems = []
    if missing:
        problems.append(f"missing in {data_dir}: {', '.join(missing)}; {_fetch_hint(data_dir)}")
    if bad:
        problems.append(
            f"{len(bad)} malformed file(s) ({bad[0]}); restore them from their source "
            f"(docs/data.md) or re-run prepare with --force"
        )
    return problems


def run_check(data_dir: Path, tasks: Sequence[str] | None = None) -> int:
    """Print one line per task; 0 when every file is there and well-formed, else 1 (and ``error: ...``)."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"--dir {data_dir} is a file, not a folder; pass the data folder (docs/data.md)")
    names = selected_tasks(tasks)
    print(f"data folder: {data_dir}" + ("" if data_dir.is_dir() else " (does not exist)"))
    reports = [check_task(data_dir, task_spec(name)) for name in names]
    for report in reports:
        print(report.line())
    problems = _problems(data_dir, reports)
    if not problems:
        return 0
    print("error: " + "; ".join(problems), file=sys.stderr)
    return 1
