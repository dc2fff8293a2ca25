"""One job of a results campaign: a ``collapipe run`` into ``ROOT/<name>/``, skipped when that run folder already
has its ``summary.json`` (so a campaign runs in pieces and reruns after an interruption)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_job(root: Path, name: str, overrides: str, flat: str = "") -> bool:
    """Run ``collapipe run`` with the flat run-config keys ``flat`` and ``overrides`` into ``root/name``; its output
    goes to ``root/<name with / as _>.log``. True when the run finished (now or before)."""
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
        rc = subprocess.call(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    print(f"job {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - start:.0f} s", flush=True)
    return rc == 0
