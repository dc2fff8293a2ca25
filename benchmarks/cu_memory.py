"""Memory of the CU side in a simulated run: the peak of Flower's ClientApp workers, where the CUs' sessions live.

Runs ``collapipe run`` (``preset='smoke'``, 2 CUs, ``--overrides``; default BERT-base classification, 3 rounds of
one local step, b = 8) and polls every ClientApp worker among the run's processes (``ray::ClientAppActor``;
psutil). Prints ``name: value`` lines:
- cu_worker_peak_uss_mib: the largest peak USS of one worker (memory only that process holds; Ray's object store
  pages, which RSS also counts, are left out);
- cu_worker_peak_rss_mib: the same worker's peak RSS, for comparison;
- cu_rounds_trained: how many CU rounds the run trained (DSSRA may leave a CU out of a round), so that two
  figures are compared on the same work.

Run: ``python benchmarks/cu_memory.py [--overrides "task=classification model=bert_base ..."]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_speedup import smoke_run_command  # noqa: E402

DEFAULT = "task=classification model=bert_base federation.num_rounds=3 federation.local_steps=1 task.batch_size=8"
CLIENT_WORKER = "ClientAppActor"  # the process title Ray gives Flower's simulation workers


def sample(proc: psutil.Process, peaks: dict[int, tuple[float, float]]) -> None:
    """Fold the current (USS, RSS) of every ClientApp worker below ``proc`` into ``peaks`` (MiB, by pid)."""
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            if CLIENT_WORKER not in " ".join(child.cmdline()):
                continue
            info = child.memory_full_info()
        except psutil.Error:  # the worker ended between the listing and the read
            continue
        uss, rss = peaks.get(child.pid, (0.0, 0.0))
        peaks[child.pid] = max(uss, info.uss / 2**20), max(rss, info.rss / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overrides", default=DEFAULT, help="Hydra overrides of the run")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between two samples")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cp-mem-") as tmp:
        cmd = smoke_run_command(Path(tmp), args.overrides.split())
        log = Path(tmp) / "run.log"
        with log.open("w") as out:
            run = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            peaks: dict[int, tuple[float, float]] = {}
            parent = psutil.Process(run.pid)
            while run.poll() is None:
                sample(parent, peaks)
                time.sleep(args.every)
        if run.returncode:
            tail = log.read_text(errors="replace").strip().splitlines()[-10:]
            raise SystemExit(f"error: the run exited {run.returncode}:\n" + "\n".join(tail))
        lines = (Path(tmp) / "r" / "rounds.jsonl").read_text().splitlines()
        trained = sum(len(json.loads(line).get("clients", {})) for line in lines if line.strip())
    if not peaks:
        raise SystemExit("error: no ClientApp worker was seen; lower --every")
    uss, rss = max(peaks.values())
    print(f"cu_worker_peak_uss_mib: {uss:.0f}")
    print(f"cu_worker_peak_rss_mib: {rss:.0f}")
    print(f"cu_rounds_trained: {trained}")


if __name__ == "__main__":
    main()
