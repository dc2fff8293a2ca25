"""Get the datasets into the layout docs/data.md describes, and check a data folder holds them.

    python -m collapipe_flwr.data check [--dir DIR] [--task NAME ...]
    python -m collapipe_flwr.data prepare [--dir DIR] [--from SRC [--link] | --from-hub] [--force] [--task NAME ...]

The files each task reads are the ones its config names (``conf/task/<name>.yaml``: ``train_src``,
``val_file``, ``vocab_file``, ``extra_train_files``, ...), read through the project's own config loading
(:func:`collapipe_flwr.config.compose` + :func:`collapipe_flwr.tasks.spec.parse_task`): rename a file there
and ``check`` / ``prepare`` follow. A test split is only looked for when the config names one.

``check`` (default folder: the one the tasks would read, see :func:`default_check_dir`, else ``./data``)
prints one line per task: ``ok`` with the example counts, or what is missing / wrong and the command that
fixes it. Files are read with the tasks' own readers (``read_parallel``, ``read_bio``, ``read_titles``), so
a file ``check`` accepts is one training accepts: translation ``.en``/``.de`` line-aligned with no empty
line; NER ``char<SPACE>tag`` lines with the 7 known tags; classification ``title_!_labelid`` lines with ids
0..num_labels-1; a vocabulary with [PAD], [UNK], [CLS], [SEP]; no file empty. Exit code 0 when all is
fine, 1 when something is missing or malformed (then a last line ``error: ...`` on stderr naming the paths
and the fix).

``prepare`` writes the layout into ``--dir`` (default ``./data``, where the tasks look when neither
``data_dir`` nor ``$COLLAPIPE_DATA_DIR`` is set), then runs ``check`` on it:

- ``--from SRC``: SRC is a folder already in the layout (e.g. a shared copy); the files the tasks need are
  copied (``--link``: DIR becomes a symlink to SRC when DIR does not exist yet, else each file is
  symlinked).
- ``--from-hub``: downloads from the Hugging Face Hub with ``datasets`` / ``huggingface_hub`` (ids from each
  task's ``hf_dataset`` block: Multi30K ``bentrevett/multi30k``, People's Daily NER ``peoples_daily_ner``,
  Toutiao titles via CLUE TNEWS ``clue/clue`` + ``tnews``; the bert-base-chinese ``vocab.txt`` with
  ``hf_hub_download``) and converts the records to the layout's formats. The tokenised Multi30K files
  (``*.lc.norm.tok.*``) are made with ``sacremoses`` (lower-case, punctuation normalisation, Moses
  tokenisation with escaping, the official pipeline's steps; not verified byte-identical to the official
  files). NOTE: the download itself was never run where this was written (no network): the record -> line
  converters (:func:`parallel_lines`, :func:`moses_lines`, :func:`bio_lines`, :func:`title_lines`) and the
  orchestration against stand-in ``datasets`` / ``huggingface_hub`` / ``sacremoses`` modules are
  unit-tested offline (tests/test_data_command.py); the calls follow those libraries' documented APIs.
  The Hub's NER and TNEWS splits are larger than the copy the experiments were run on (docs/data.md).
- neither: only checks DIR and prints the commands that would fetch what is missing.

An existing non-empty file in DIR is never replaced without ``--force`` (an identical one is left as it
is). Bad input (a SRC that is not a folder or lacks files, a conflict, a missing library): one line
``error: ...`` on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from collapipe_flwr.config import CONF_DIR, DATA_DIR_ENV, DEFAULT_DATA_DIR_NAME, compose, resolve_data_dir
from collapipe_flwr.errors import ConfigError, DataFormatError, exit_on_user_error
from collapipe_flwr.tasks.classification import CLASS_NAMES, SEPARATOR, TOUTIAO_CODES, read_titles
from collapipe_flwr.tasks.data_files import text_lines
from collapipe_flwr.tasks.ner import LABEL_IDS, read_bio
from collapipe_flwr.tasks.spec import TaskSpec, parse_task
from collapipe_flwr.tasks.translation import read_parallel

PROG = "python -m collapipe_flwr.data"
# The format of each task's data files (a task not listed here gets the plain non-empty text check).
FILE_KINDS = {"translation": "parallel", "ner": "bio", "classification": "titles"}
UNITS = {"parallel": "pairs", "bio": "sentences", "titles": "titles", "vocab": "tokens", "text": "lines"}
VOCAB_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
SPLITS = ("train", "val", "test")
# Hub defaults when a task's hf_dataset block names none (the conf/task files do name them).
HUB_DEFAULTS: dict[str, dict[str, Any]] = {
    "translation": {"id": "bentrevett/multi30k", "src": "en", "tgt": "de"},
    "ner": {"id": "peoples_daily_ner"},
    "classification": {"id": "clue/clue", "subset": "tnews"},
}
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}
VOCAB_REPO = "google-bert/bert-base-chinese"  # the Hub's name of bert-base-chinese (the old id redirects here)


# ----------------------------------------------------------------------------- what the tasks read
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


def _path(data_dir: Path, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else data_dir / path


def _relative(name: str) -> bool:
    return bool(name) and not Path(name).expanduser().is_absolute()


# ----------------------------------------------------------------------------- check
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
        paths = [_path(data_dir, name) for name in group.names]
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


def _selected(tasks: Sequence[str] | None) -> list[str]:
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


def run_check(data_dir: Path, tasks: Sequence[str] | None = None) -> int:
    """Print one line per task; 0 when every file is there and well-formed, else 1 (and ``error: ...``)."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"--dir {data_dir} is a file, not a folder; pass the data folder (docs/data.md)")
    names = _selected(tasks)
    print(f"data folder: {data_dir}" + ("" if data_dir.is_dir() else " (does not exist)"))
    reports = [check_task(data_dir, task_spec(name)) for name in names]
    for report in reports:
        print(report.line())
    missing = list(dict.fromkeys(name for report in reports for name in report.missing))
    bad = [reason for report in reports for reason in report.bad]
    if not missing and not bad:
        return 0
    problems = []
    if missing:
        problems.append(f"missing in {data_dir}: {', '.join(missing)}; {_fetch_hint(data_dir)}")
    if bad:
        problems.append(
            f"{len(bad)} malformed file(s) ({bad[0]}); restore them from their source "
            f"(docs/data.md) or re-run prepare with --force"
        )
    print("error: " + "; ".join(problems), file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------- prepare: writing files
def _needed_names(tasks: Sequence[str]) -> list[str]:
    """The data-folder-relative names the tasks read (absolute names are outside any layout)."""
    names = [name for task in tasks for group in file_groups(task_spec(task)) for name in group.names]
    return [name for name in dict.fromkeys(names) if _relative(name)]


def _occupied(path: Path) -> bool:
    """Whether writing ``path`` would replace data: a non-empty file (or a link to one)."""
    if path.is_symlink() and not path.exists():
        return False  # a dangling link holds nothing
    if path.is_dir():
        raise ConfigError(f"{path} is a folder where a data file belongs; move it away")
    return path.is_file() and path.stat().st_size > 0


def _refuse(conflicts: Sequence[Path]) -> None:
    if conflicts:
        more = f" and {len(conflicts) - 1} more" if len(conflicts) > 1 else ""
        raise ConfigError(
            f"{conflicts[0]}{more} already exist(s) with other content; pass --force to overwrite, "
            "or choose another --dir"
        )


def _replace(path: Path, write: Callable[[Path], object]) -> None:
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


def _copy_of(source: Path) -> Callable[[Path], object]:
    return lambda tmp: shutil.copyfile(source, tmp)


def _link_to(source: Path) -> Callable[[Path], object]:
    return lambda tmp: tmp.symlink_to(source)


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """``lines`` as a UTF-8 text file with LF endings (atomically); the number of lines."""
    text = "".join(f"{line}\n" for line in lines)
    _replace(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"))
    return text.count("\n")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _refuse_linked(dest: Path) -> None:
    """Writing through a ``--dir`` that is a symlink (an earlier ``--link``) would change the linked folder."""
    if dest.is_symlink():
        raise ConfigError(
            f"--dir {dest} is a symlink to {dest.resolve()}; writing would change that folder: remove the link "
            f"(rm {dest}) or choose another --dir"
        )


def prepare_from(src: Path, dest: Path, tasks: Sequence[str], link: bool, force: bool) -> None:
    """Copy (or symlink) the files the tasks read from ``src``, a folder in the layout, into ``dest``."""
    src = src.expanduser().resolve()
    if not src.is_dir():
        raise ConfigError(f"--from {src} is not a folder; pass a data folder in the layout of docs/data.md")
    names = _needed_names(tasks)
    absent = [name for name in names if not (src / name).is_file()]
    if absent:
        raise ConfigError(
            f"--from {src} lacks {', '.join(absent)}; `{PROG} check --dir {src}` lists what it holds "
            "(layout: docs/data.md)"
        )
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"--dir {dest} is a file, not a folder; choose another --dir")
    if dest.is_dir() and dest.resolve() == src:
        print(f"{dest} is {src} already; nothing to copy")
        return
    if link and not os.path.lexists(dest):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(src, target_is_directory=True)
        except OSError as err:
            raise ConfigError(f"cannot create the link {dest}: {err.strerror or err}") from None
        print(f"linked {dest} -> {src}")
        return
    _refuse_linked(dest)
    todo = [name for name in names if not _same_file(src / name, dest / name)]
    _refuse([dest / name for name in todo if not force and _occupied(dest / name)])
    for name in todo:
        source, target = src / name, dest / name
        if link:
            _replace(target, _link_to(source))
        else:
            _replace(target, _copy_of(source))
    verb = "linked" if link else "copied"
    print(f"{verb} {len(todo)} file(s) from {src} into {dest} ({len(names) - len(todo)} already there)")


# ----------------------------------------------------------------------------- prepare: the Hub
def parallel_lines(rows: Iterable[Mapping[str, Any]], src: str, tgt: str) -> tuple[list[str], list[str]]:
    """Hub translation records -> the aligned lines of the source and target files (whitespace normalised,
    pairs with an empty side dropped so the files stay line-aligned)."""
    src_lines, tgt_lines = [], []
    for row in rows:
        s, t = " ".join(str(row[src] or "").split()), " ".join(str(row[tgt] or "").split())
        if s and t:
            src_lines.append(s)
            tgt_lines.append(t)
    return src_lines, tgt_lines


def moses_lines(lines: Iterable[str], normalize: Callable[[str], str], tokenize: Callable[[str], str]) -> list[str]:
    """Raw sentences -> the official ``lc.norm.tok`` form: lower-case, normalise punctuation, tokenise
    (``normalize``/``tokenize``: sacremoses' MosesPunctNormalizer.normalize / MosesTokenizer.tokenize)."""
    return [" ".join(tokenize(normalize(line.lower())).split()) for line in lines]


def _moses(moses: Any, lang: str) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """sacremoses' punctuation normaliser and tokeniser (escaping ' as &apos; like the official files)."""
    normalizer, tokenizer = moses.MosesPunctNormalizer(lang=lang), moses.MosesTokenizer(lang=lang)

    def tokenize(text: str) -> str:
        return tokenizer.tokenize(text, return_str=True, escape=True)

    return normalizer.normalize, tokenize


def bio_lines(rows: Iterable[Mapping[str, Any]], tag_names: Sequence[str]) -> list[str]:
    """Hub NER records (``tokens``, ``ner_tags`` as ClassLabel ids) -> ``char<SPACE>tag`` lines, a blank line
    after each sentence. Whitespace tokens are dropped (they cannot be written as ``char tag``)."""
    for tag in tag_names:
        if tag not in LABEL_IDS:
            raise DataFormatError(f"NER tag {tag!r} of the Hub dataset is not one of {', '.join(LABEL_IDS)}")
    lines: list[str] = []
    for row in rows:
        pairs = [(str(char), tag_names[int(tag)]) for char, tag in zip(row["tokens"], row["ner_tags"])]
        pairs = [(char, tag) for char, tag in pairs if char.strip()]
        if pairs:
            lines.extend(f"{char.strip()} {tag}" for char, tag in pairs)
            lines.append("")
    return lines


def title_lines(
    rows: Iterable[Mapping[str, Any]], label_names: Sequence[str], codes: Sequence[int] = TOUTIAO_CODES
) -> list[str]:
    """Hub TNEWS records (``sentence``, ``label`` a ClassLabel whose names are the Toutiao codes "100".."116")
    -> ``title_!_labelid`` lines with ids 0..14 (docs/data.md); unlabelled rows (label -1) are dropped."""
    code_to_id = {int(code): i for i, code in enumerate(codes)}
    lines = []
    for row in rows:
        label = int(row["label"])
        if label < 0:
            continue
        code = int(label_names[label])
        if code not in code_to_id:
            raise DataFormatError(f"TNEWS label code {code} is not a Toutiao class ({', '.join(map(str, codes))})")
        title = " ".join(str(row["sentence"] or "").split())
        if title:
            lines.append(f"{title}{SEPARATOR}{code_to_id[code]}")
    return lines


def _import(module: str, why: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--from-hub needs the {module} package ({why}): pip install {module}") from None


def _hub_split(datasets: Any, hf: Mapping[str, Any], split: str):
    """One split of a Hub dataset; a script-only repository (which datasets >= 4 refuses) is read from the
    Hub's automatic parquet export instead."""
    ident, subset = str(hf["id"]), hf.get("subset")
    name = str(hf.get(f"{split}_split", HUB_SPLITS[split]))
    try:
        try:
            return datasets.load_dataset(ident, subset, split=name)
        except RuntimeError as err:
            if "scripts are no longer supported" not in str(err):
                raise
            return datasets.load_dataset(ident, subset, split=name, revision="refs/convert/parquet")
    except Exception as err:  # network, missing repository, changed schema: one line and the fallback
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"cannot load {ident}{'/' + subset if subset else ''} split {name} from the Hugging Face Hub: {first}; "
            f"check the network, or use `{PROG} prepare --from <folder in the layout>`"
        ) from None


def _class_names(rows: Any, hf: Mapping[str, Any], column: str) -> list[str]:
    """The ClassLabel names of ``column`` (a sequence of labels for NER's ``ner_tags``)."""
    try:
        feature = rows.features[column]
        return list(getattr(feature, "feature", feature).names)
    except (AttributeError, KeyError, TypeError):
        raise ConfigError(
            f"the Hub dataset {hf['id']} has no label names for its {column!r} column (its schema changed?); "
            f"use `{PROG} prepare --from <folder in the layout>`"
        ) from None


def _hub_files(spec: TaskSpec) -> dict[str, Any]:
    return {**HUB_DEFAULTS.get(spec.name, {}), **{k: v for k, v in spec.hf_dataset.items() if k != "enabled"}}


def _hub_groups(tasks: Sequence[str]) -> list[FileGroup]:
    """The file groups --from-hub writes: every task's splits and its vocab (once per file name)."""
    groups: list[FileGroup] = []
    for task in tasks:
        for group in file_groups(task_spec(task)):
            if group.split == "extra" or any(g.names == group.names for g in groups):
                continue  # extra corpora are not on the Hub in this form (docs/data.md); a shared vocab once
            if task not in HUB_DEFAULTS and group.kind != "vocab":
                raise ConfigError(f"--from-hub knows no Hub source for task {task!r}; use --from <folder>")
            groups.append(group)
    return groups


def prepare_from_hub(dest: Path, tasks: Sequence[str], force: bool) -> None:
    """Download the tasks' train/val (and configured test) splits and the vocab, write them in the layout.
    Only tested offline, against stand-in modules (see the module docstring)."""
    _refuse_linked(dest)
    groups = _hub_groups(tasks)
    targets = [name for group in groups for name in group.names if _relative(name)]
    _refuse([dest / name for name in dict.fromkeys(targets) if not force and _occupied(dest / name)])
    datasets = _import("datasets", "the Hugging Face datasets library")
    hub = _import("huggingface_hub", "to download vocab.txt")
    needs_moses = any(".tok." in Path(name).name for g in groups if g.kind == "parallel" for name in g.names)
    moses = _import("sacremoses", "the Moses tokeniser for multi30k/tok/*.lc.norm.tok.*") if needs_moses else None
    vocab: Path | None = None
    for group in groups:
        if not all(_relative(name) for name in group.names):
            print(f"skip {', '.join(group.names)}: an absolute path is outside the data folder")
            continue
        if group.kind == "vocab":
            if vocab is None:
                try:
                    vocab = Path(hub.hf_hub_download(repo_id=VOCAB_REPO, filename="vocab.txt"))
                except Exception as err:  # network or hub errors: one line and the fallback
                    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                    raise ConfigError(
                        f"cannot download vocab.txt of {VOCAB_REPO}: {first}; check the network, or use "
                        f"`{PROG} prepare --from <folder in the layout>`"
                    ) from None
            source = vocab
            _replace(dest / group.names[0], _copy_of(source))
            print(f"wrote {group.names[0]} ({VOCAB_REPO})")
            continue
        spec = task_spec(group.task)
        hf = _hub_files(spec)
        rows = _hub_split(datasets, hf, group.split)
        if group.kind == "parallel":
            sides = parallel_lines(rows, str(hf.get("src", "en")), str(hf.get("tgt", "de")))
            for name, lines, lang in zip(group.names, sides, (hf.get("src", "en"), hf.get("tgt", "de"))):
                if ".tok." in Path(name).name and moses is not None:
                    lines = moses_lines(lines, *_moses(moses, str(lang)))
                count = write_lines(dest / name, lines)
                print(f"wrote {name} ({count:,} lines from {hf['id']})")
        elif group.kind == "bio":
            count = write_lines(dest / group.names[0], bio_lines(rows, _class_names(rows, hf, "ner_tags")))
            print(f"wrote {group.names[0]} ({count:,} lines from {hf['id']})")
        elif group.kind == "titles":
            count = write_lines(dest / group.names[0], title_lines(rows, _class_names(rows, hf, "label")))
            print(
                f"wrote {group.names[0]} ({count:,} titles from {' '.join(filter(None, (hf['id'], hf.get('subset'))))})"
            )
    print(
        "note: the Hub's NER and TNEWS splits are larger than the copy the paper's experiments used; "
        "say which one a result was trained on (docs/data.md)"
    )


# ----------------------------------------------------------------------------- the command line
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a data folder holds every file the tasks read (docs/data.md)")
    check.add_argument("--dir", default="", help="the data folder (default: the one the tasks would read, else ./data)")
    prepare = sub.add_parser("prepare", help="write the layout of docs/data.md into a folder, then check it")
    prepare.add_argument("--dir", default=DEFAULT_DATA_DIR_NAME, help="where to write (default: ./data)")
    source = prepare.add_mutually_exclusive_group()
    source.add_argument(
        "--from", dest="source", default="", metavar="SRC", help="a folder already in the layout to copy from"
    )
    source.add_argument("--from-hub", action="store_true", help="download from the Hugging Face Hub and convert")
    prepare.add_argument("--link", action="store_true", help="with --from: symlink instead of copying")
    prepare.add_argument("--force", action="store_true", help="overwrite existing non-empty files")
    for command in (check, prepare):
        command.add_argument(
            "--task", action="append", default=None, help="only this task (repeatable; default: every conf/task file)"
        )
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = _selected(args.task)
    if args.command == "check":
        return run_check(Path(args.dir).expanduser().resolve() if args.dir else default_check_dir(), tasks)
    dest = Path(args.dir).expanduser().absolute()
    if args.link and not args.source:
        raise ConfigError("--link needs --from <folder> (it links to that folder's files)")
    if args.source:
        prepare_from(Path(args.source), dest, tasks, link=args.link, force=args.force)
    elif args.from_hub:
        prepare_from_hub(dest, tasks, force=args.force)
    code = run_check(dest, tasks)
    if code and not (args.source or args.from_hub):
        print(
            f"to fetch it: `{PROG} prepare --dir {dest} --from <folder in the layout> [--link]` or "
            f"`{PROG} prepare --dir {dest} --from-hub` (needs internet; docs/data.md)"
        )
    return code


__all__ = [
    "FileGroup",
    "TaskReport",
    "bio_lines",
    "check_task",
    "default_check_dir",
    "file_groups",
    "main",
    "moses_lines",
    "parallel_lines",
    "prepare_from",
    "prepare_from_hub",
    "run_check",
    "task_names",
    "task_spec",
    "title_lines",
    "write_lines",
]

if __name__ == "__main__":
    raise SystemExit(main())
