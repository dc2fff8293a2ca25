"""Pure aggregation of one run's per-round records (rounds.jsonl) into series and a table row.

Definitions (paper symbols; the records are described in collapipe_flwr/fl/server/strategy.py):
- round delay tau(t) = max_n (tau_n^pipe + tau_n^Up) over the selected CUs (eq. 26), the record's
  ``modelled.round_delay_s``. Its split into computation / D2D / uplink is the one of the bottleneck
  CU (the selected n with the largest ``delay_s``): tau_n^pipe = compute_s + d2d_s (eq. 15, the
  critical device's chunk), so compute + D2D + uplink = tau(t).
- on-device computation time of round t: the bottleneck CU's ``compute_s`` (Figs. 7-8, modelled);
  the measured counterpart is the slowest CU's ``seconds-train`` (wall-clock of its local steps).
- modelled energy of round t: sum over selected CUs of sum_k E_k (device_energy_j) + p_n tau_n^Up
  (cu_energy_j), eq. (16) and the CU's uplink energy.
- per-device memory: the largest ``device-peak-bytes`` any device of any CU reported.

Reading a record's metric, selected CUs, delay split and energy is shared with the run's own plots
(collapipe_flwr/fl/records/round_values.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from collapipe_flwr.fl.records.round_values import metric_name, round_delay_split, round_energy, selected_clusters
from collapipe_flwr.fl.records.round_values import number as _num

LABEL_KEYS = ("method", "scheduler", "V", "task", "model", "network", "federation")
MIB = 1024.0 * 1024.0


def train_rounds(rounds: Iterable[Mapping]) -> list[Mapping]:
    """The records of training rounds t >= 1, by round (round 0 holds only the initial evaluation)."""
    return sorted((r for r in rounds if int(r.get("round", 0)) >= 1), key=lambda r: int(r["round"]))


def round_peak_bytes(record: Mapping) -> float | None:
    """The largest per-device peak memory any CU reported this round."""
    measured = [
        _num(b) for client in (record.get("clients") or {}).values() for b in (client.get("device-peak-bytes") or [])
    ]
    peaks = [p for p in measured if p is not None]
    return max(peaks) if peaks else None


def round_train_seconds(record: Mapping) -> float | None:
    """Measured: the slowest CU's ``seconds-train`` this round (the round waits for it)."""
    measured = [_num(c.get("seconds-train")) for c in (record.get("clients") or {}).values()]
    values = [v for v in measured if v is not None]
    return max(values) if values else None


def cumulative(values: Sequence[float | None]) -> list[float | None]:
    """Running sums; None from the first missing value on (a gap would understate the total)."""
    out: list[float | None] = []
    total: float | None = 0.0
    for value in values:
        if value is None or total is None:
            total = None
        else:
            total += value
        out.append(total)
    return out


def _sum(values: Iterable[float | None]) -> float | None:
    given = list(values)
    present = [v for v in given if v is not None]
    if not given or len(present) < len(given):
        return None
    return float(sum(present))


def series(rounds: Iterable[Mapping]) -> dict[str, list]:
    """Per-round series of a run: round, train_loss, metric, delay split, compute, energy, memory."""
    records = train_rounds(rounds)
    name = metric_name(records)
    splits = [round_delay_split(r) or {} for r in records]
    energies = [round_energy(r) or {} for r in records]
    return {
        "round": [int(r["round"]) for r in records],
        "train_loss": [_num(r.get("train_loss")) for r in records],
        "metric": [_num(r.get(f"val_{name}")) if name else None for r in records],
        "delay": [s.get("delay") for s in splits],
        "compute": [s.get("compute") for s in splits],
        "d2d": [s.get("d2d") for s in splits],
        "uplink": [s.get("uplink") for s in splits],
        "energy_device": [e.get("device") for e in energies],
        "energy_cu": [e.get("cu") for e in energies],
        "measured_train_s": [round_train_seconds(r) for r in records],
        "measured_round_s": [_num((r.get("measured_s") or {}).get("round_s")) for r in records],
        # the round on the virtual clock (fl/server/virtual_round.py): measured compute at the devices' speeds
        "virtual_round_s": [_num((r.get("virtual") or {}).get("round_s")) for r in records],
        "peak_bytes": [round_peak_bytes(r) for r in records],
    }


def plan_shape(rounds: Iterable[Mapping]) -> dict:
    """S and m the run used: the distinct values, the most common (S, m) pair and the last round's deltas."""
    pairs: list[tuple[int, int]] = []
    last_deltas: list[tuple[int, ...]] = []
    for record in train_rounds(rounds):
        entries = [entry for entry, _ in selected_clusters(record)] or [
            c for c in ((record.get("plan") or {}).get("clusters") or []) if c.get("selected")
        ]
        pairs += [(int(e["S"]), int(e["m"])) for e in entries if "S" in e and "m" in e]
        last_deltas = [tuple(int(x) for x in e.get("delta", ())) for e in entries] or last_deltas
    if not pairs:
        return {"S_values": [], "m_values": [], "S": None, "m": None, "deltas": []}
    (S, m), _ = Counter(pairs).most_common(1)[0]
    return {
        "S_values": sorted({p[0] for p in pairs}),
        "m_values": sorted({p[1] for p in pairs}),
        "S": S,
        "m": m,
        "mean_S": sum(p[0] for p in pairs) / len(pairs),
        "mean_m": sum(p[1] for p in pairs) / len(pairs),
        "deltas": last_deltas,
    }


def segment_scheduling(config: Mapping) -> bool | None:
    """Whether Sub-1 chose S, m, delta (method and scheduler both allow it); None without a config."""
    method, scheduler = config.get("method") or {}, config.get("scheduler") or {}
    if not (method or scheduler):
        return None
    return not (
        method.get("segment_scheduling") is False
        or scheduler.get("segment_scheduling") is False
        or scheduler.get("name") == "uniform"
    )


def is_uniform_partition(config: Mapping, rounds: Iterable[Mapping]) -> bool:
    """Whether the run split the encoder uniformly (no segment scheduling): from config, else from the plans."""
    scheduled = segment_scheduling(config)
    if scheduled is not None:
        return not scheduled
    deltas = plan_shape(rounds)["deltas"]
    used = [[d for d in delta if d > 0] for delta in deltas]
    return bool(used) and all(max(u) - min(u) <= 1 for u in used if u)


def _fmt_values(values: Sequence[int]) -> str:
    return "/".join(str(v) for v in values)


def run_row(
    name: str,
    labels: Mapping,
    rounds: Sequence[Mapping],
    ok: bool,
    error: str = "",
    wall_s: float | None = None,
    config: Mapping | None = None,
) -> dict:
    """The results-table row of one run (plain values; None where the run has no data)."""
    s = series(rounds)
    shape = plan_shape(rounds)
    metric = metric_name(rounds)
    losses = [v for v in s["train_loss"] if v is not None]
    metrics = [v for v in s["metric"] if v is not None]
    peaks = [v for v in s["peak_bytes"] if v is not None]
    energy_device, energy_cu = _sum(s["energy_device"]), _sum(s["energy_cu"])
    return {
        "run": name,
        "ok": bool(ok),
        **{k: labels.get(k) for k in LABEL_KEYS},
        "rounds": len(s["round"]),
        "segment_scheduling": segment_scheduling(config or {}),
        "S": _fmt_values(shape["S_values"]),
        "m": _fmt_values(shape["m_values"]),
        "delta_last": ";".join(",".join(str(d) for d in delta) for delta in shape["deltas"]),
        "metric": metric,
        "final_metric": metrics[-1] if metrics else None,
        "final_train_loss": losses[-1] if losses else None,
        "min_train_loss": min(losses) if losses else None,
        "delay_total_s": _sum(s["delay"]),
        "delay_compute_s": _sum(s["compute"]),
        "delay_d2d_s": _sum(s["d2d"]),
        "delay_uplink_s": _sum(s["uplink"]),
        "energy_device_j": energy_device,
        "energy_cu_j": energy_cu,
        "energy_total_j": None if energy_device is None or energy_cu is None else energy_device + energy_cu,
        "measured_train_s": _sum(s["measured_train_s"]),
        "measured_round_s": _sum(s["measured_round_s"]),
        "virtual_round_s": _sum(s["virtual_round_s"]),
        "wall_s": wall_s,
        "max_device_mem_mib": max(peaks) / MIB if peaks else None,
        "error": error,
    }


def distinguishing_labels(label_sets: Sequence[Mapping], keys: Sequence[str] = LABEL_KEYS) -> list[str]:
    """The label keys whose values differ between runs (what a legend must show)."""
    return [k for k in keys if len({str(labels.get(k)) for labels in label_sets}) > 1]


def legend(labels: Mapping, keys: Sequence[str]) -> str:
    """``method=collapipe V=10`` from the distinguishing keys (the method alone when nothing differs)."""
    keys = list(keys) or ["method"]
    return " ".join(f"{k}={labels.get(k)}" for k in keys)
