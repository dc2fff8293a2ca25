"""Values read back from rounds.jsonl records (collapipe_flwr/fl/records/round_record.py writes them).

Shared by the run's own plots (collapipe_flwr/fl/records/run_plots.py) and the sweep report
(collapipe_flwr/experiments/aggregate.py), so both read a record the same way:
- the task metric is the ``val_<name>`` key the evaluator wrote (bleu | f1 | accuracy | perplexity; perplexity
  is the one where lower is better, :data:`LOWER_IS_BETTER`);
- the CUs that trained are the plan's ``selected`` entries (modelled and plan rows are in cluster order);
- the round delay tau(t) = ``modelled.round_delay_s`` (eq. 26), split into computation / D2D / uplink as
  the bottleneck CU's (the selected CU with the largest ``delay_s``): compute_s + d2d_s + uplink_s = tau(t);
- the round's modelled energy is the selected CUs' sum_k ``device_energy_j`` plus their ``cu_energy_j``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

METRICS = ("bleu", "f1", "accuracy", "perplexity")
LOWER_IS_BETTER = frozenset({"perplexity"})  # every other task metric: higher is better
# val_<key> entries that accompany the task metric rather than being one
VAL_COMPANIONS = ("loss", "examples")


def number(value: Any) -> float | None:
    """A finite float, or None (missing, non-numeric, bool, NaN/inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def metric_name(rounds: Iterable[Mapping]) -> str | None:
    """The task metric the run logs (bleu | f1 | accuracy | perplexity), or None."""
    for record in rounds:
        for name in METRICS:
            if f"val_{name}" in record:
                return name
    return None


def selected_clusters(record: Mapping) -> list[tuple[Mapping, Mapping]]:
    """(plan entry, modelled entry) of the CUs that trained this round (plan and modelled are in cluster order)."""
    modelled = (record.get("modelled") or {}).get("clusters") or []
    plan = (record.get("plan") or {}).get("clusters") or []
    pairs = []
    for i, row in enumerate(modelled):
        entry = plan[i] if i < len(plan) else {}
        chosen = entry.get("selected") if "selected" in entry else (number(row.get("delay_s")) or 0.0) > 0
        if chosen:
            pairs.append((entry, row))
    return pairs


def round_delay_split(record: Mapping) -> dict | None:
    """{delay, compute, d2d, uplink} (s) of a round, the split taken from the bottleneck CU; None if unmodelled."""
    pairs = selected_clusters(record)
    total = number((record.get("modelled") or {}).get("round_delay_s"))
    if not pairs:
        return None if total is None else {"delay": total, "compute": None, "d2d": None, "uplink": None}
    _, row = max(pairs, key=lambda pair: number(pair[1].get("delay_s")) or 0.0)
    parts = {k: number(row.get(f"{k}_s")) for k in ("compute", "d2d", "uplink")}
    if total is None:
        total = number(row.get("delay_s"))
    return {"delay": total, **parts}


def round_energy(record: Mapping) -> dict | None:
    """{device, cu, total} modelled energy (J) of the round's selected CUs; None if unmodelled."""
    pairs = selected_clusters(record)
    if not pairs:
        return None
    device = sum(sum(number(e) or 0.0 for e in (row.get("device_energy_j") or [])) for _, row in pairs)
    cu = sum(number(row.get("cu_energy_j")) or 0.0 for _, row in pairs)
    return {"device": device, "cu": cu, "total": device + cu}
