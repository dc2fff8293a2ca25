"""Finding and reading run folders (the I/O edge of the report).

Two kinds of folders are recognised under a report's DIR:
- a sweep job folder: it holds ``status.json`` (written by :mod:`collapipe_flwr.experiments.launch`)
  and, when training started, its run folder ``run/`` (config.json, rounds.jsonl, summary.json);
- a plain run folder written by ``flwr run .`` (config.json and/or rounds.jsonl, no status.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.experiments.job import labels_of
from collapipe_flwr.fl.records.run_log import read_rounds

STATUS_FILE = "status.json"
RUN_FILES = ("rounds.jsonl", "config.json")
REPORT_SUBDIR = "report"


@dataclass
class RunData:
    """One run as read from disk. ``status`` is None for a plain `flwr run .` folder."""

    name: str
    path: Path
    labels: dict
    config: dict = field(default_factory=dict)
    rounds: list[dict] = field(default_factory=list)
    summary: dict | None = None
    status: dict | None = None

    @property
    def ok(self) -> bool:
        if self.status is not None:
            return bool(self.status.get("ok"))
        return self.summary is not None

    @property
    def error(self) -> str:
        if self.status is not None:
            return str(self.status.get("error") or "")
        return "" if self.summary is not None else "no summary.json (the run did not finish)"

    @property
    def wall_s(self) -> float | None:
        value = (self.status or {}).get("wall_s")
        return float(value) if isinstance(value, (int, float)) else None


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _is_run_folder(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_FILES)


def find_run_paths(root: Path) -> list[Path]:
    """Job folders (with status.json) and plain run folders under ``root`` (or ``root`` itself)."""
    root = Path(root)
    if not root.is_dir():
        raise CollaPipeError(f"report folder {root} does not exist; pass a Hydra multirun folder or a run folder")
    if (root / STATUS_FILE).is_file() or _is_run_folder(root):
        return [root]
    report_dir = root / REPORT_SUBDIR
    jobs = sorted({p.parent for p in root.rglob(STATUS_FILE) if report_dir not in p.parents}, key=_natural_key)
    plain = set()
    for name in RUN_FILES:
        for p in root.rglob(name):
            folder = p.parent
            if report_dir in folder.parents or any(job == folder or job in folder.parents for job in jobs):
                continue
            plain.add(folder)
    return sorted(jobs + sorted(plain), key=_natural_key)


def load_run(path: Path, root: Path | None = None) -> RunData:
    """Read one job folder or run folder."""
    path = Path(path)
    status = _read_json(path / STATUS_FILE)
    run_dir = path
    if status is not None:
        run_dir = Path(status["run_dir"]) if status.get("run_dir") else path / "run"
        if not run_dir.is_dir() and (path / "run").is_dir():  # the sweep folder was moved
            run_dir = path / "run"
    config = _read_json(run_dir / "config.json") or {}
    labels = dict((status or {}).get("labels") or {}) or labels_of(config)
    try:
        name = str(path.relative_to(root)) if root is not None else path.name
    except ValueError:
        name = path.name
    return RunData(
        name=name if name != "." else path.name,
        path=path,
        labels=labels,
        config=config,
        rounds=read_rounds(run_dir),
        summary=_read_json(run_dir / "summary.json"),
        status=status,
    )


def load_runs(root: Path) -> list[RunData]:
    root = Path(root)
    paths = find_run_paths(root)
    if not paths:
        raise CollaPipeError(
            f"no run folders under {root}; expected job folders with status.json or run folders with rounds.jsonl"
        )
    return [load_run(p, root) for p in paths]


def sweep_command(root: Path) -> str | None:
    """The ``python -m collapipe_flwr.experiments -m ...`` command that made a multirun folder (from the
    multirun.yaml Hydra writes there), or None for other folders."""
    path = Path(root) / "multirun.yaml"
    if not path.is_file():
        return None
    try:
        import shlex

        from omegaconf import OmegaConf

        overrides = list(OmegaConf.load(path).hydra.overrides.task)
    except Exception:  # noqa: BLE001 - an unreadable multirun.yaml only loses the command line
        return None
    return "python -m collapipe_flwr.experiments -m " + " ".join(shlex.quote(str(o)) for o in overrides)
