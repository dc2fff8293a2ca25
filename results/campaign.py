"""One job of a results campaign: a ``collapipe run`` into ``ROOT/<name>/``, skipped when that run folder already
has its ``summary.json`` (so a campaign runs in pieces and reruns after an interruption)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
MB = 1e6


def run_job(root: Path, name: str, overrides: str, flat: str = "") -> bool:
    """Run ``collapipe run`` with the flat run-config keys ``flat`` and ``overrides`` into ``root/name``; its output
        goes to ``root/<name with / as _>.log``; a finished run's wall seconds and the peak memory of its process tree
    (summed PSS, sampled every 5 s) and the code version (:func:`code_version`) go to its folder's ``cost.json``.
    True when the run finished (now or before)."""
    folder = root / name
    if (folder / "summary.json").is_file():
        return True
    folder.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "collapipe_flwr", "run",
        "--run-config", f"{flat} output-dir='{folder.parent}' run-name='{folder.name}'".strip(),
        "--run-config", f'overrides="{overrides}"',
    ]  # fmt: skip
    start = time.time()
    with open(root / (name.replace("/", "_") + ".log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        peak = peak_tree_pss(proc)
    rc = proc.returncode
    wall = time.time() - start
    if rc == 0:
        cost = {"wall_s": round(wall, 1), "peak_pss_mb": round(peak / MB, 1), "commit": code_version()}
        (folder / "cost.json").write_text(json.dumps(cost))
    print(
        f"job {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {wall:.0f} s, peak memory {peak / MB:.0f} MB",
        flush=True,
    )
    return rc == 0


def code_version(repo: Path = REPO) -> str:
    """The commit the campaign's code is checked out at (``git rev-parse HEAD``), with ``+changes`` when its tracked
    files differ from it; "" outside a git checkout. A job's cost.json keeps it, so a part's records say which code
    version ran them."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return ""
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=repo, check=False).returncode != 0
    return head.stdout.strip() + ("+changes" if dirty else "")


def peak_tree_pss(proc: subprocess.Popen, every_s: float = 5.0) -> float:
    """Wait for ``proc``; the largest sum of the proportional set size (PSS: shared pages split between the
    processes sharing them) over it and all its descendants, sampled every ``every_s`` seconds (psutil)."""
    root = psutil.Process(proc.pid)
    peak = 0.0
    while proc.poll() is None:
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        peak = max(peak, total)
        try:
            proc.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
    return peak


def keep_records(folder: Path, dest: Path, stem: str) -> Path:
    """Copy a finished run's records into the repository as ``dest/<stem>.*``: rounds.jsonl (gzip), summary.json,
    status.json and, where the campaign measured it, cost.json."""
    dest.mkdir(parents=True, exist_ok=True)
    with open(folder / "rounds.jsonl", "rb") as src, gzip.open(dest / f"{stem}.rounds.jsonl.gz", "wb") as out:
        shutil.copyfileobj(src, out)
    for name in ("summary.json", "status.json", "cost.json"):
        if name != "cost.json" or (folder / name).is_file():
            shutil.copyfile(folder / name, dest / f"{stem}.{name}")
    return dest


QueueEntry = tuple[Path, str, str, Callable[[], object]]


def run_queue(title: str, entries: Sequence[QueueEntry]) -> int:
    """Run each ``(root, name, overrides, keep)`` job not yet done (``run_job``) and ``keep()`` its records once it
    finished; says how many were done before. Returns 1 if any job failed, else 0."""
    done = sum((root / name / "summary.json").is_file() for root, name, _, _ in entries)
    print(f"{title}: {done} of {len(entries)} jobs done, {len(entries) - done} left", flush=True)
    failed = 0
    for root, name, overrides, keep in entries:
        if run_job(root, name, overrides):
            keep()
        else:
            failed += 1
    return 1 if failed else 0
