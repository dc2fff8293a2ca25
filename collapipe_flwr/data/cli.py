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
  unit-tested offline (tests/data/test_data_command.py); the calls follow those libraries' documented APIs.
  The Hub's NER and TNEWS splits are larger than the copy the experiments were run on (docs/data.md).
- neither: only checks DIR and prints the commands that would fetch what is missing.

An existing non-empty file in DIR is never replaced without ``--force`` (an identical one is left as it
is). Bad input (a SRC that is not a folder or lacks files, a conflict, a missing library): one line
``error: ...`` on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from collapipe_flwr.config import DEFAULT_DATA_DIR_NAME
from collapipe_flwr.data.check import default_check_dir, run_check, selected_tasks
from collapipe_flwr.data.from_folder import prepare_from
from collapipe_flwr.data.hub import prepare_from_hub
from collapipe_flwr.data.layout import PROG
from collapipe_flwr.errors import ConfigError, exit_on_user_error


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
    tasks = selected_tasks(args.task)
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
