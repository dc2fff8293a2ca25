"""Tables of the paper-setting testbed campaign (issue 44), generated from the records kept in the repository.

``python results/testbed_paper_tables.py`` reads ``results/testbed_paper/records/j<J>/s<seed>/<run>.*`` (kept by
``results/testbed_paper.py``) and writes ``results/testbed_paper/runs.csv`` (one row per J, seed and run) and
``results/testbed_paper/table.md``. ``tests/results/test_results_testbed_paper.py`` regenerates both from the records
and fails when the committed text differs.

How a round is measured. The server's clock from ``configure_train`` to the end of ``aggregate_train``
(``measured_s.round_s`` in rounds.jsonl) counts everything of the round: the CUs' set-up (actor start, weights
loaded, blocks placed), profiling, local steps (compute, D2D hand-overs, the data-plane exchange with the
server's decoder, z_enc's emulated uplink), the weight upload, and the server's planning, Flower messaging and
aggregation. On this 2-core machine the CUs train one after another (``runtime.concurrent_cus=1``), so the clock
counts the clusters in series, where the system (and eq. 26's max over clusters) runs them in parallel on their
own hardware. The **measured round** is therefore read as

    round_s - sum_n seconds-total_n + max_n total_n

with seconds-total_n the CU's own wall clock for its round: the server's time outside the CUs plus the slowest
cluster's total_n. VanillaFL's D data users also run one after another here (docs/baselines.md), so its total_n
counts the slowest user's hand-over and steps, not all D (``parallel_train_s``): each user's steps
(``seconds-users``) and hand-over (its device loaded, its model read back: ``seconds-users-handover``) are
measured apart, and the rest of the CU's training time (the users' average, the batches) counts in full. Records
from before the hand-overs were measured per user (they have no ``seconds-users-handover``) divide the measured
hand-overs evenly among the D users instead: an estimate, marked so in ``runs.csv`` (``users_read``). Round 1
includes starting the 18 device actors and the first profile; it is counted in the time to target and shown
apart in the per-round figures (``steady`` = rounds 2 and later).

The quality target, fixed before the campaign ran: a round's mean training loss (``train_loss``, the selected
CUs' mean over their local steps) at or below ``TARGET_LOSS``. The measured time to target is the sum of the
measured rounds up to and including the first that reaches it; a run that never reaches it says so.

Calibration: eq. (26) alone (the plan's ``delay_s`` per cluster, ``round_delay_s`` per round; modelled) against
the CU-side time measured for the same terms (total_n less its set-up, profiling and check-pointing: local steps
+ upload) and against the measured round; the CU's measured own time per step (``overhead_s``, which the plan
reports beside eq. 26 and never adds in) is given apart. Per-device memory: the largest peak any device's memory
cgroup measured in the run (Table III's comparison), beside C7's modelled bytes for the same device-round. On-device
computation (Figs. 7-8): per cluster-round the busiest device's measured compute seconds, summed over the run,
beside the plan's modelled ``compute_s`` summed the same way. Devices lost for memory: how many times, over the
seeds, the kernel killed a device over its gamma_k^max (the CU re-planned around it within the round).
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from pathlib import Path

import numpy as np
from reportlib import markdown as md  # results/, first on sys.path when run as a script
from reportlib.records import modelled, read_jsonl_gz
from reportlib.stats import plus_minus

HERE = Path(__file__).resolve().parent / "testbed_paper"
RECORDS = HERE / "records"
TARGET_LOSS = 7.0  # translation, transformer_small at L = 6: a round's mean training loss (set before the campaign)
COLUMNS = (
    "channels",
    "seed",
    "run",
    "rounds",
    "mean_S",
    "final_train_loss",
    "target_round",
    "measured_s_to_target",
    "measured_s_total",
    "round1_s",
    "steady_round_s",
    "steady_cu_s",
    "steady_compute_share",
    "steady_d2d_link_s",
    "steady_upload_s",
    "steady_head_s",
    "steady_server_s",
    "modelled_round_s",
    "peak_device_mb",
    "modelled_peak_device_mb",
    "device_compute_s",
    "modelled_compute_s",
    "lost_for_memory",
    "users_read",
)


def load(path: Path) -> list[dict]:
    return [r for r in read_jsonl_gz(path) if r.get("round", 0) > 0 and r.get("plan")]


def records(folder: Path = RECORDS) -> list[tuple[int, int, str, list[dict]]]:
    """(J, seed, run, rounds) of every kept job, sorted."""
    out = []
    for path in sorted(folder.glob("j*/s*/*.rounds.jsonl.gz")):
        run = path.name.removesuffix(".rounds.jsonl.gz")
        out.append((int(path.parent.parent.name[1:]), int(path.parent.name[1:]), run, load(path)))
    return out


def parallel_train_s(cu: dict) -> float:
    """CU n's local steps with its data users (if any) read as parallel: the training time less every user's
    hand-over and steps, plus the slowest user's (``seconds-users`` + ``seconds-users-handover``, measured per
    user); a record without per-user hand-overs adds the slowest user's steps and one user's share of
    ``seconds-train - sum(seconds-users)`` instead (:func:`users_read`: "estimated")."""
    train = float(cu["seconds-train"])
    users = cu.get("seconds-users") or []
    if not users:
        return train
    handovers = cu.get("seconds-users-handover") or []
    if len(handovers) == len(users):
        own = [float(u) + float(h) for u, h in zip(users, handovers)]
        return train - sum(own) + max(own)
    return max(users) + (train - sum(users)) / len(users)


def users_read(r: dict) -> str:
    """How a round's data users were read as parallel: "measured" (every user's hand-over measured apart),
    "estimated" (an older record: the hand-overs shared evenly) or "" (no data users)."""
    return _weakest(
        {
            "measured" if len(cu.get("seconds-users-handover") or []) == len(cu["seconds-users"]) else "estimated"
            for cu in r["clients"].values()
            if cu.get("seconds-users")
        }
    )


def _weakest(kinds: set[str]) -> str:
    """ "estimated" if any reading is, else "measured" if any is, else "" (no data users)."""
    return "estimated" if "estimated" in kinds else "measured" if "measured" in kinds else ""


def cu_total(cu: dict) -> float:
    """CU n's own seconds for its round, its data users (if any) read as running in parallel."""
    return float(cu["seconds-total"]) - float(cu["seconds-train"]) + parallel_train_s(cu)


def cu_round_s(cu: dict) -> float:
    """The CU-side time eq. (26) models: local steps (their data users in parallel) + the weight upload."""
    return parallel_train_s(cu) + float(cu.get("seconds-upload", 0.0))


def measured_round(r: dict) -> float:
    """The round's server clock with the clusters read as parallel (the module's docstring)."""
    return server_outside_cus(r) + max((cu_total(cu) for cu in r["clients"].values()), default=0.0)


def server_outside_cus(r: dict) -> float:
    """The server's seconds of the round outside every CU's own clock: planning, Flower messaging, aggregation."""
    return float(r["measured_s"]["round_s"]) - sum(float(cu["seconds-total"]) for cu in r["clients"].values())


def _slowest(r: dict) -> dict:
    return max(r["clients"].values(), key=cu_total)


def job_row(channels: int, seed: int, run: str, rounds: list[dict]) -> dict:
    """The figures of one job (one row of runs.csv)."""
    measured = [measured_round(r) for r in rounds]
    reached = next((i for i, r in enumerate(rounds) if float(r["train_loss"]) <= TARGET_LOSS), None)
    steady = rounds[1:] or rounds
    slow = [_slowest(r) for r in steady]
    cu_s = [cu_round_s(c) for c in slow]
    compute = [max(c["device-compute-seconds"]) for c in slow]
    selected = [c for r in rounds for c in r["plan"]["clusters"] if c["selected"]]
    peaks = [p for r in rounds for c in r["clients"].values() for p in c["device-measured-peak-bytes"]]
    peak_at = _argmax_device(rounds)
    return {
        "channels": channels,
        "seed": seed,
        "run": run,
        "rounds": len(rounds),
        "mean_S": statistics.mean(c["S"] for c in selected),
        "final_train_loss": float(rounds[-1]["train_loss"]),
        "target_round": "" if reached is None else reached + 1,
        "measured_s_to_target": "" if reached is None else sum(measured[: reached + 1]),
        "measured_s_total": sum(measured),
        "round1_s": measured[0],
        "steady_round_s": statistics.mean(measured[1:] or measured),
        "steady_cu_s": statistics.mean(cu_s),
        "steady_compute_share": statistics.mean(a / b for a, b in zip(compute, cu_s) if b > 0),
        "steady_d2d_link_s": _d2d_link_s(slow),
        "steady_upload_s": statistics.mean(float(c.get("seconds-upload", 0.0)) for c in slow),
        "steady_head_s": statistics.mean(float(c.get("seconds-step-head", 0.0)) for c in slow),
        "steady_server_s": statistics.mean(server_outside_cus(r) for r in steady),
        "modelled_round_s": statistics.mean(modelled(r).round_delay_s for r in steady),
        "peak_device_mb": max(peaks) / 2**20,
        "modelled_peak_device_mb": peak_at / 2**20,
        "device_compute_s": sum(max(c["device-compute-seconds"]) for r in rounds for c in r["clients"].values()),
        "modelled_compute_s": sum(c.compute_s for r in rounds for c in modelled(r).clusters if c.delay_s),
        # devices the kernel killed for exceeding gamma_k^max, each re-planned around within its round
        "lost_for_memory": sum(len(c.get("lost-for-memory") or []) for r in rounds for c in r["clients"].values()),
        # data users read as parallel from per-user hand-overs ("measured"), or the older even share ("estimated")
        "users_read": _weakest({users_read(r) for r in rounds}),
    }


def _d2d_link_s(slow: list[dict]) -> float | str:
    """Mean over the steady rounds of the slowest CU's D2D link seconds, summed over its devices (each stage's
    outgoing link held by the token bucket, eq. 13; in a pipeline these overlap other stages' compute); "" for
    records from before the stages reported it (``device-link-seconds``)."""
    if not slow or any("device-link-seconds" not in c for c in slow):
        return ""
    return statistics.mean(sum(float(x) for x in c["device-link-seconds"]) for c in slow)


def _argmax_device(rounds: list[dict]) -> float:
    """C7's modelled bytes on the device-round whose measured peak is the run's largest (0 if not modelled)."""
    best, modelled = -1.0, 0.0
    for r in rounds:
        for n, cu in r["clients"].items():
            mem = (r.get("memory") or {}).get("clusters", {}).get(n, {})
            for k, peak in enumerate(cu["device-measured-peak-bytes"]):
                if peak > best:
                    best = peak
                    modelled = float((mem.get("modelled_bytes") or [0.0] * (k + 1))[k])
    return modelled


def calibration(jobs: list[tuple[int, int, str, list[dict]]]) -> list[str]:
    """eq. (26) alone against the measured CU-side time and the measured round, over every run (rounds >= 2): per
    J and over all of them."""
    per_cu: dict[str, list[tuple[float, float]]] = {}
    per_round: dict[str, list[tuple[float, float]]] = {}
    overhead = []
    for channels, _, _, rounds in jobs:
        for r in rounds[1:]:
            plan = modelled(r)
            for n, cu in r["clients"].items():
                mod = plan.clusters[int(n)]
                if mod.delay_s:
                    for key in (f"J = {channels}", "all"):
                        per_cu.setdefault(key, []).append((mod.delay_s, cu_round_s(cu)))
                    overhead.append(mod.overhead_s)
            for key in (f"J = {channels}", "all"):
                per_round.setdefault(key, []).append((plan.round_delay_s, measured_round(r)))
    lines = md.head(
        "| eq. (26) alone against | runs | points | median abs. rel. error | p90 | median modelled / measured |"
    )
    keys = sorted(per_round, key=lambda k: (k == "all", -int(k.split()[-1]) if k != "all" else 0))
    for name, found in (("the CU-side time (local steps + upload)", per_cu), ("the measured round", per_round)):
        for key in keys:
            pairs = found.get(key)
            if not pairs:
                continue
            mod, meas = np.array(pairs).T
            rel = np.abs(mod - meas) / meas
            lines.append(
                f"| {name} | {key} | {len(pairs)} | {100 * np.median(rel):.1f}% | {100 * np.percentile(rel, 90):.1f}% "
                f"| {np.median(mod / meas):.2f} |"
            )
    if overhead:
        lines += [
            "",
            f"The CU's measured own time (`overhead_s`: embedding and data-plane exchange, lagged from earlier "
            f"rounds), reported beside eq. (26) and not in it: median {np.median(overhead):.2f} s per cluster-round.",
        ]
    return lines


def _mean_sd(values: list[float]) -> str:
    return plus_minus(values, 1) if values else "-"


def method_lines(rows: list[dict]) -> list[str]:
    """Per J and run: the means over seeds."""
    lines = md.head(
        "| J | run | seeds | mean S | reached target | s to target | round 1 s | steady round s | CU-side s | "
        "D2D link s | upload s | head s | server + messaging s | eq. (26) s | peak device MiB (C7) | device "
        "compute s (modelled) | devices lost for memory |"
    )
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["channels"], row["run"]), []).append(row)
    for (j, run), rs in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        reached = [r for r in rs if r["target_round"] != ""]

        def col(key: str, of: list[dict] = rs) -> str:
            return _mean_sd([float(r[key]) for r in of if r[key] != ""])

        lines.append(
            f"| {j} | {run} | {len(rs)} | {statistics.mean(r['mean_S'] for r in rs):.2f} | {len(reached)} of "
            f"{len(rs)} | {col('measured_s_to_target', reached)} | {col('round1_s')} | {col('steady_round_s')} | "
            f"{col('steady_cu_s')} | {col('steady_d2d_link_s')} | {col('steady_upload_s')} | {col('steady_head_s')} | "
            f"{col('steady_server_s')} | "
            f"{col('modelled_round_s')} | {col('peak_device_mb')} ({col('modelled_peak_device_mb')}) | "
            f"{col('device_compute_s')} ({col('modelled_compute_s')}) | "
            f"{sum(int(r['lost_for_memory']) for r in rs)} |"
        )
    return lines


def users_lines(rows: list[dict]) -> list[str]:
    """Per J, how VanillaFL's data users were read as parallel (``users_read``), when any job has data users."""
    lines = []
    for j in sorted({r["channels"] for r in rows}, reverse=True):
        reads = [r["users_read"] for r in rows if r["channels"] == j and r["users_read"]]
        if reads:
            lines.append(
                f"J = {j}: data users read as parallel from each user's measured hand-over in "
                f"{reads.count('measured')} of {len(reads)} jobs, from an even share of the hand-overs (an "
                f"estimate, older records) in {reads.count('estimated')}."
            )
    return [*lines, ""] if lines else []


def csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in row.items()})
    return buf.getvalue()


def table(jobs: list[tuple[int, int, str, list[dict]]]) -> str:
    rows = [job_row(*job) for job in jobs]
    lines = [
        "# The paper-setting testbed campaign (generated by results/testbed_paper_tables.py from records/)",
        "",
        "N = 3 clusters of K = 6 devices (network=testbed_paper), transformer_small at L = 6 on Multi30K En-De, "
        "every method planning from measured profiles; `python results/testbed_paper.py ROOT` ran the jobs. "
        "Means +- sd over the seeds. *Measured*: every column but `eq. (26) s`, the modelled C7 in brackets "
        "and the modelled compute in brackets. A measured round reads the clusters, and VanillaFL's data users, as "
        "parallel (results/testbed_paper_tables.py says how); `steady` = rounds 2 and later; `CU-side s` = the "
        "slowest cluster's local steps + upload; `D2D link s` = the seconds its devices' links held their "
        "hand-overs, summed over its devices (eq. 13; inside the local steps, overlapping other stages' compute; `-` "
        "for records from before the stages reported it); `head s` = its exchange with the server's decoder "
        f"(VanillaFL: its users' own heads, summed). Target: a round's mean training loss <= {TARGET_LOSS}.",
        "",
        *method_lines(rows),
        "",
        *users_lines(rows),
        "## Calibration of eq. (26) over every run above (rounds 2 and later)",
        "",
        *calibration(jobs),
        "",
    ]
    return "\n".join(lines)


def write(folder: Path = HERE) -> tuple[str, str]:
    jobs = records(folder / "records")
    text, rows_csv = table(jobs), csv_text([job_row(*job) for job in jobs])
    md.write(folder / "table.md", text)
    md.write(folder / "runs.csv", rows_csv)
    return text, rows_csv


def main() -> int:
    if not any(RECORDS.glob("j*/s*/*.rounds.jsonl.gz")):
        print(f"no kept records under {RECORDS}: run python results/testbed_paper.py ROOT first", file=sys.stderr)
        return 1
    text, _ = write()
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
