"""``prepare --from-hub``: download the tasks' splits and the vocab from the Hugging Face Hub (``datasets``,
``huggingface_hub``, ``sacremoses`` for the tokenised Multi30K files) and write them in the layout. Only
tested offline, against stand-in modules (tests/data/test_data_command.py)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collapipe_flwr.data.files import copy_of, occupied, refuse_conflicts, refuse_linked, replace, write_lines
from collapipe_flwr.data.hub_lines import bio_lines, moses_lines, moses_steps, parallel_lines, title_lines
from collapipe_flwr.data.layout import PROG, FileGroup, file_groups, is_relative, task_spec
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.base import HUB_SPLITS
from collapipe_flwr.tasks.spec import TaskSpec

# Hub defaults when a task's hf_dataset block names none (the conf/task files do name them).
HUB_DEFAULTS: dict[str, dict[str, Any]] = {
    "translation": {"id": "bentrevett/multi30k", "src": "en", "tgt": "de"},
    "ner": {"id": "peoples_daily_ner"},
    "classification": {"id": "clue/clue", "subset": "tnews"},
}
VOCAB_REPO = "google-bert/bert-base-chinese"  # the Hub's name of bert-base-chinese (the old id redirects here)


def _import(module: str, why: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--from-hub needs the {module} package ({why}): pip install {module}") from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


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
        raise ConfigError(
            f"cannot load {ident}{'/' + subset if subset else ''} split {name} from the Hugging Face Hub: "
            f"{_first_line(err)}; check the network, or use `{PROG} prepare --from <folder in the layout>`"
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
    """The file groups --from-hub writes: every task's splits and its vocab (once per file name). Tasks with a Hub
    source go first, so a task that only reads their files (causal_lm: Multi30K's English side) needs none."""
    groups: list[FileGroup] = []
    covered: set[str] = set()
    for task in sorted(tasks, key=lambda name: name not in HUB_DEFAULTS):
        for group in file_groups(task_spec(task)):
            if group.split == "extra" or set(group.names) <= covered:
                continue  # extra corpora are not on the Hub in this form (docs/data.md); a shared file once
            if task not in HUB_DEFAULTS and group.kind != "vocab":
                raise ConfigError(f"--from-hub knows no Hub source for task {task!r}; use --from <folder>")
            groups.append(group)
            covered |= set(group.names)
    return groups


def _download_vocab(hub: Any) -> Path:
    """bert-base-chinese's vocab.txt, downloaded (or from the Hub's local cache)."""
    try:
        return Path(hub.hf_hub_download(repo_id=VOCAB_REPO, filename="vocab.txt"))
    except Exception as err:  # network or hub errors: one line and the fallback
        raise ConfigError(
            f"cannot download vocab.txt of {VOCAB_REPO}: {_first_line(err)}; check the network, or use "
            f"`{PROG} prepare --from <folder in the layout>`"
        ) from None


def _write_split(dest: Path, group: FileGroup, datasets: Any, moses: Any) -> None:
    """Download the split of ``group`` and write its file(s) into ``dest`` in the layout's format."""
    hf = _hub_files(task_spec(group.task))
    rows = _hub_split(datasets, hf, group.split)
    if group.kind == "parallel":
        sides = parallel_lines(rows, str(hf.get("src", "en")), str(hf.get("tgt", "de")))
        for name, lines, lang in zip(group.names, sides, (hf.get("src", "en"), hf.get("tgt", "de"))):
            if ".tok." in Path(name).name and moses is not None:
                lines = moses_lines(lines, *moses_steps(moses, str(lang)))
            count = write_lines(dest / name, lines)
            print(f"wrote {name} ({count:,} lines from {hf['id']})")
    elif group.kind == "bio":
        count = write_lines(dest / group.names[0], bio_lines(rows, _class_names(rows, hf, "ner_tags")))
        print(f"wrote {group.names[0]} ({count:,} lines from {hf['id']})")
    elif group.kind == "titles":
        count = write_lines(dest / group.names[0], title_lines(rows, _class_names(rows, hf, "label")))
        print(f"wrote {group.names[0]} ({count:,} titles from {' '.join(filter(None, (hf['id'], hf.get('subset'))))})")


def prepare_from_hub(dest: Path, tasks: Sequence[str], force: bool) -> None:
    """Download the tasks' train/val (and configured test) splits and the vocab, write them in the layout.
    Only tested offline, against stand-in modules (see the module docstring)."""
    refuse_linked(dest)
    groups = _hub_groups(tasks)
    targets = [name for group in groups for name in group.names if is_relative(name)]
    refuse_conflicts([dest / name for name in dict.fromkeys(targets) if not force and occupied(dest / name)])
    datasets = _import("datasets", "the Hugging Face datasets library")
    hub = _import("huggingface_hub", "to download vocab.txt")
    needs_moses = any(".tok." in Path(name).name for g in groups if g.kind == "parallel" for name in g.names)
    moses = _import("sacremoses", "the Moses tokeniser for multi30k/tok/*.lc.norm.tok.*") if needs_moses else None
    vocab: Path | None = None
    for group in groups:
        if not all(is_relative(name) for name in group.names):
            print(f"skip {', '.join(group.names)}: an absolute path is outside the data folder")
        elif group.kind == "vocab":
            vocab = vocab or _download_vocab(hub)
            replace(dest / group.names[0], copy_of(vocab))
            print(f"wrote {group.names[0]} ({VOCAB_REPO})")
        else:
            _write_split(dest, group, datasets, moses)
    print(
        "note: the Hub's NER and TNEWS splits are larger than the copy the paper's experiments used; "
        "say which one a result was trained on (docs/data.md)"
    )
