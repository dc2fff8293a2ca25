"""The run's output folder: config.json once, one JSON line per round in rounds.jsonl, summary.json.

Every method writes the same record (loss, task metric, modelled delay split into compute / D2D /
uplink, modelled energy, measured seconds per phase, per-device memory, the plan), so runs compare
like with like. Records are appended and flushed per round: a crash loses at most the current round.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    return value


class RunLog:
    """Append-only JSON-lines log of one run."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rounds_path = self.folder / "rounds.jsonl"
        self._t0 = time.time()

    def write_config(self, config: dict) -> None:
        (self.folder / "config.json").write_text(json.dumps(_json_safe(config), indent=2, sort_keys=True))

    def append_round(self, record: dict) -> None:
        record = dict(record)
        record.setdefault("elapsed_s", round(time.time() - self._t0, 3))
        with self.rounds_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(_json_safe(record), sort_keys=True) + "\n")
            fh.flush()

    def save_weights(self, t: int, results: list, aggregate: dict) -> None:
        """weights/round<t>_cluster<n>.pt per returned CU (+ its num-examples) and round<t>_global.pt."""
        import torch

        folder = self.folder / "weights"
        folder.mkdir(exist_ok=True)
        for cluster, parts, metrics in results:
            torch.save(
                {"parts": parts, "num_examples": int(metrics["num-examples"])}, folder / f"round{t}_cluster{cluster}.pt"
            )
        torch.save({"parts": aggregate}, folder / f"round{t}_global.pt")

    def write_summary(self, summary: dict) -> None:
        (self.folder / "summary.json").write_text(json.dumps(_json_safe(summary), indent=2, sort_keys=True))


def read_rounds(folder: str | Path) -> list[dict]:
    """All round records of a run folder (skips a truncated last line)."""
    path = Path(folder) / "rounds.jsonl"
    records: list[dict] = []
    if not path.is_file():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
