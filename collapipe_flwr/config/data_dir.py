"""Where the datasets and the config tree are: ``conf/``, the data folder (``data_dir``, else
``$COLLAPIPE_DATA_DIR``, else ``./data`` or ``data/`` beside ``conf/``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from collapipe_flwr.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
DATA_DIR_ENV = "COLLAPIPE_DATA_DIR"
DEFAULT_DATA_DIR_NAME = "data"  # ./data, made by `python -m collapipe_flwr.data prepare`


def default_data_dirs(cwd: Path | None = None) -> list[Path]:
    """Where the datasets are looked for when neither data_dir nor $COLLAPIPE_DATA_DIR is set:
    ``./data`` (the repository root's ``data/`` when commands start there, where
    ``python -m collapipe_flwr.data prepare`` writes by default), then ``data/`` beside ``conf/``."""
    here = (cwd or Path.cwd()) / DEFAULT_DATA_DIR_NAME
    beside_conf = CONF_DIR.parent / DEFAULT_DATA_DIR_NAME
    return [here] if here.resolve() == beside_conf.resolve() else [here, beside_conf]


def resolve_data_dir(explicit: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> Path:
    """The dataset folder: an explicit value, else the COLLAPIPE_DATA_DIR variable of ``environ``
    (default: this process's environment), else the first of :func:`default_data_dirs` that exists."""
    environ = os.environ if environ is None else environ
    value = str(explicit or "") or environ.get(DATA_DIR_ENV, "")
    if not value:
        for candidate in default_data_dirs():
            if candidate.is_dir():
                return candidate.resolve()
        raise ConfigError(
            f"no data directory: run `python -m collapipe_flwr.data prepare` (writes ./{DEFAULT_DATA_DIR_NAME}), "
            f"or set data_dir (run config data-dir) or {DATA_DIR_ENV} to the folder holding multi30k/, "
            "chinese_ner/, toutiao/ (docs/data.md)"
        )
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(
            f"data directory {path} does not exist; point data_dir or {DATA_DIR_ENV} at the dataset folder "
            "or run `python -m collapipe_flwr.data prepare` (docs/data.md)"
        )
    return path
