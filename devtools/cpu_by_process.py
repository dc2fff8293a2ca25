"""Where a run's CPU goes: every process's CPU seconds over a window, grouped by what the process is.

    python devtools/cpu_by_process.py --seconds 180 [--delay 110] [--top 12]

Waits ``--delay`` seconds (start it beside ``collapipe run`` and skip the start-up rounds), then reads every
process's CPU time (user + system, psutil) at the window's start and end and prints, per group, the core-seconds
spent in the window, with the machine's busy and steal shares over the same window (``/proc/stat`` through
psutil). Groups come from the process's command line or Ray's process title: the Flower simulation process (which
runs the ServerApp and its decoder host), Ray device actors (``ray::StageActor``), the CUs (``ray::ClientAppActor``),
Flower's SuperLink, Ray's own daemons, and everything else by name. A process that starts inside the window counts
from zero; one that ends inside it is missed (the groups' sum then falls short of the machine's busy time).
docs/running.md ("Where that VM's time goes") was measured this way.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import psutil

GROUPS = (  # (text in the command line, group name), first match wins
    ("flwr-simulation", "Flower simulation process (ServerApp, decoder host)"),
    ("ray::StageActor", "device actors (ray::StageActor)"),
    ("ray::ClientAppActor", "CUs (ray::ClientAppActor)"),
    ("flower-superlink", "Flower SuperLink"),
    ("flower-superexec", "Flower SuperExec"),
    ("raylet", "Ray daemons"),
    ("gcs_server", "Ray daemons"),
    ("log_monitor", "Ray daemons"),
    ("dashboard", "Ray daemons"),
    ("ray::", "Ray daemons"),
    ("collapipe run", "collapipe launcher"),
)


def group_of(cmdline: str) -> str:
    for text, name in GROUPS:
        if text in cmdline:
            return name
    return "other: " + (cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "?")


def snapshot() -> dict[int, tuple[str, float]]:
    """{pid: (group, CPU seconds so far)} of every process readable now."""
    out = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        info = proc.info
        times = info.get("cpu_times")
        if times is None:
            continue
        cmdline = " ".join(info.get("cmdline") or []) or str(info.get("name") or "")
        out[info["pid"]] = (group_of(cmdline), times.user + times.system)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, required=True, help="length of the window")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before the window starts")
    parser.add_argument("--top", type=int, default=12, help="groups printed")
    args = parser.parse_args()
    time.sleep(args.delay)
    machine0, start, t0 = psutil.cpu_times(), snapshot(), time.monotonic()
    time.sleep(args.seconds)
    machine1, end, t1 = psutil.cpu_times(), snapshot(), time.monotonic()
    spent: Counter[str] = Counter()
    for pid, (group, cpu) in end.items():
        spent[group] += cpu - (start[pid][1] if pid in start else 0.0)
    total = sum(machine1) - sum(machine0)
    idle = (machine1.idle + machine1.iowait) - (machine0.idle + machine0.iowait)
    steal = getattr(machine1, "steal", 0.0) - getattr(machine0, "steal", 0.0)
    cores = psutil.cpu_count() or 1
    print(f"window: {t1 - t0:.1f} s, {cores} cores, {cores * (t1 - t0):.1f} core-seconds")
    print(f"machine busy: {1 - idle / total:.0%}, steal: {steal / total:.1%}")
    for group, seconds in spent.most_common(args.top):
        print(f"{seconds:8.1f} core-s  {group}")
    print(f"{sum(spent.values()):8.1f} core-s  all groups")


if __name__ == "__main__":
    main()
