"""The records a run keeps: rounds.jsonl (one JSON object a line, plain or gzip-compressed), its JSON files and the
CSV files the scripts write from them; and the plan's modelled round of a record, typed."""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collapipe_flwr.dssra.plan import ModelledRound


def read_jsonl_gz(path: Path) -> list[dict]:
    """Every record of a ``*.jsonl.gz`` file, in order (blank lines skipped)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_jsonl(path: Path) -> list[dict]:
    """Every record of a plain ``*.jsonl`` file (a run folder's ``rounds.jsonl``), in order (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_json(path: Path) -> Any:
    """A kept JSON file (``summary.json``, ``status.json``, ``central.json``, ...)."""
    return json.loads(path.read_text(encoding="utf-8"))


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a kept CSV file with a header line, as {column: text}."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def modelled(record: Mapping[str, Any]) -> ModelledRound | None:
    """The plan's modelled round of a rounds.jsonl record (its ``modelled`` section), None where it has none."""
    section = record.get("modelled")
    return ModelledRound.from_dict(section) if section else None
