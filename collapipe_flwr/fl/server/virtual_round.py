"""A round on the virtual clock (``pipeline/virtual_clock.py``), put together on the server.

Each CU reports its cluster's steps on the virtual clock by part (its report's ``virtual`` figures: the devices'
critical path, what the D2D hand-overs add, its embedding, the uplink at R_n, its set-up as measured); the server adds
what it did for that cluster, the CPU seconds of its decoder's head steps (the head sits between a GPipe step's
forward and backward, so it adds to the cluster's path), and its own part of the round, the plan and the
aggregation (CPU seconds of the server's thread). The round is the slowest selected cluster plus the server's
part: eq. (26)'s max over n, with every term measured or modelled from bytes instead of from FLOPs alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collapipe_flwr.fl.round_report import RoundReport

PARTS = ("compute", "d2d", "cu", "uplink", "setup")


def virtual_round(
    clients: Mapping[int, RoundReport], decoder_cpu_s: Mapping[int, float], server_cpu_s: float
) -> dict[str, Any]:
    """The record's ``virtual`` section: ``clusters`` {n: each part's seconds (``<part>_s``), ``decoder_s``,
    ``device_s`` per device k, ``total_s``}, ``server_s``, the ``slowest`` cluster and ``round_s`` = its total +
    ``server_s``. Empty when no CU reported a virtual clock."""
    rows: dict[str, dict[str, Any]] = {}
    for n, report in sorted(clients.items()):
        clock = report.virtual
        if clock is None:
            continue
        decoder = float(decoder_cpu_s.get(int(n), 0.0))
        row: dict[str, Any] = {f"{part}_s": float(getattr(clock, part)) for part in PARTS}
        row["decoder_s"] = decoder
        row["device_s"] = list(clock.device)
        row["total_s"] = clock.cluster + decoder
        rows[str(n)] = row
    if not rows:
        return {}
    slowest = max(rows, key=lambda n: rows[n]["total_s"])
    return {
        "clusters": rows,
        "server_s": float(server_cpu_s),
        "slowest": int(slowest),
        "round_s": rows[slowest]["total_s"] + float(server_cpu_s),
    }
