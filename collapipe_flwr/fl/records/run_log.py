"""The run's output folder: config.json once, one JSON line per round in rounds.jsonl, summary.json.

Every method writes the same record (loss, task metric, modelled delay split into compute / D2D /
uplink, modelled energy, measured seconds per phase, per-device memory, the plan), so runs compare
like with like. Records are appended and flushed per round: a crash loses at most the current round, and a
line torn by a crash never merges with the next record. config.json and summary.json are replaced
atomically (temporary file + ``os.replace``): a reader sees the old file or the new one, never a part. A
folder that already holds a run is refused unless the run is resumed; an I/O error (disk full, no
permission) is a one-line error naming the file.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapipe_flwr.atomic_files import file_errors, write_atomic
from collapipe_flwr.errors import ConfigError

if TYPE_CHECKING:
    from collapipe_flwr.config import RunConfig

RUN_FILES = ("config.json", "rounds.jsonl", "summary.json", "checkpoint.pt")


def first_difference(old: Any, new: Any, path: str = "") -> str | None:
    """The dotted key where two config mappings first differ (None when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                return where
            found = first_difference(old[key], new[key], where)
            if found:
                return found
        return None
    return None if old == new else (path or "<root>")


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


def check_run_folder(folder: Path, resume: bool) -> None:
    """Refuse, before anything is written, a folder that holds a run unless it is resumed, and a resume of a
    run that finished (its summary.json is there: there is no round left to run)."""
    present = [name for name in RUN_FILES if (folder / name).exists()]
    if present and not resume:
        raise ConfigError(
            f"run folder {folder} already holds a run ({', '.join(present)}); pick another run_name, "
            "or add resume=true to continue it from its last complete round"
        )
    if resume and (folder / "summary.json").exists():
        raise ConfigError(
            f"run {folder} finished (summary.json is there): there is nothing to resume; start a new run_name"
        )


def run_folder(cfg: RunConfig) -> Path:
    """The run's folder: ``output_dir/run_name``, or a fresh one claimed for an unnamed run. Here, beside the
    folder's other rules, so that ``collapipe run`` names it without importing the server."""
    if cfg.resume and not cfg.run_name:
        raise ConfigError("resume=true needs the run_name of the run to continue (run_name=<name>)")
    parent = Path(cfg.output_dir).expanduser().resolve()
    if cfg.run_name:
        return parent / cfg.run_name
    # an unnamed run claims a fresh folder (two started in the same second get -2, -3, ..)
    return claim_run_folder(parent, time.strftime("%Y%m%d-%H%M%S") + f"-{cfg.method.name}-{cfg.task.name}")


def claim_run_folder(parent: Path, base: str) -> Path:
    """A new folder ``parent/base`` (``base-2``, ``base-3``, .. when taken), created atomically, so two runs
    started in the same second never share one."""
    with file_errors(parent, "create the output folder"):
        parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = parent / (base if n == 1 else f"{base}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            with file_errors(folder, "create the run folder"):
                raise err from None
        return folder
    raise ConfigError(f"no free run folder {parent / base}-N after 999 tries; clean up {parent}")


class RunLog:
    """Append-only JSON-lines log of one run in ``folder`` (refused when the folder holds a run already,
    unless ``resume``)."""

    def __init__(self, folder: str | Path, resume: bool = False) -> None:
        self.folder = Path(folder)
        self.rounds_path = self.folder / "rounds.jsonl"
        self._t0 = time.time()
        check_run_folder(self.folder, resume)
        with file_errors(self.folder, "create the run folder"):
            self.folder.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: dict, resume: bool = False) -> None:
        """config.json; when resuming, the config must be the run's own (``resume`` aside)."""
        path = self.folder / "config.json"
        if resume and path.is_file():
            with file_errors(path, "read"):
                saved = json.loads(path.read_text(encoding="utf-8"))
            new = json.loads(json.dumps(_json_safe(config)))
            key = first_difference({**saved, "resume": None}, {**new, "resume": None})
            if key is not None:
                raise ConfigError(
                    f"cannot resume {self.folder}: {key} differs from the run's config.json; resume with the same "
                    "overrides (plus resume=true), or start a new run_name"
                )
            return
        write_atomic(path, json.dumps(_json_safe(config), indent=2, sort_keys=True))

    def keep_rounds_through(self, t: int) -> int:
        """Resuming after round t: drop later and torn records from rounds.jsonl; returns how many stay."""
        kept = [r for r in read_rounds(self.folder) if int(r.get("round", -1)) <= t]
        write_atomic(self.rounds_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        return len(kept)

    def append_round(self, record: dict) -> None:
        record = dict(record)
        record.setdefault("elapsed_s", round(time.time() - self._t0, 3))
        line = json.dumps(_json_safe(record), sort_keys=True) + "\n"
        with file_errors(self.rounds_path, "append to"):
            with self.rounds_path.open("a+b") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() > 0:
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":  # a line torn by a crash: end it, readers skip it
                        line = "\n" + line
                fh.write(line.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())

    def save_cluster_weights(self, t: int, cluster: int, parts: dict, num_examples: int) -> None:
        """weights/round<t>_cluster<n>.pt: CU n's returned parts and num-examples (written as its reply is folded
        in, so the server never holds every CU's copy at once)."""
        import torch

        folder = self.folder / "weights"
        with file_errors(folder, "write weights to"):
            folder.mkdir(exist_ok=True)
            torch.save({"parts": parts, "num_examples": int(num_examples)}, folder / f"round{t}_cluster{cluster}.pt")

    def save_global_weights(self, t: int, aggregate: dict) -> None:
        """weights/round<t>_global.pt: the round's new global parts."""
        import torch

        folder = self.folder / "weights"
        with file_errors(folder, "write weights to"):
            folder.mkdir(exist_ok=True)
            torch.save({"parts": aggregate}, folder / f"round{t}_global.pt")

    def write_summary(self, summary: dict) -> None:
        write_atomic(self.folder / "summary.json", json.dumps(_json_safe(summary), indent=2, sort_keys=True))


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
