"""The records a run keeps under results/: one JSON object a line, gzip-compressed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_jsonl_gz(path: Path) -> list[dict]:
    """Every record of a ``*.jsonl.gz`` file, in order (blank lines skipped)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
