"""A round on the virtual clock (``pipeline/virtual_clock.py``), put together on the server.

Each CU reports its cluster's steps on the virtual clock by part (its report's ``virtual`` figures: the devices'
critical path, what the D2D hand-overs add, its embedding, the uplink at R_n, its set-up as measured); the server adds
what it did for that cluster, the CPU seconds of its decoder's head steps (the head sits between a GPipe step's
forward and backward, so it adds to the cluster's path), and its own part of the round, the plan and the
aggregation (CPU seconds of the server's thread). Both are the server's own work, set against the edge server's
speed: x ``server_scale`` (host speed / clock.server_flops; 1 = the host's own seconds). The round is the slowest
selected cluster plus the server's part: eq. (26)'s max over n, with every term measured or modelled from bytes
instead of from FLOPs alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collapipe_flwr.fl.round_report import RoundReport

PARTS = ("compute", "d2d", "cu", "uplink", "setup")


def virtual_round(
    clients: Mapping[int, RoundReport],
    decoder_cpu_s: Mapping[int, float],
    server_cpu_s: float,
    server_scale: float = 1.0,
    host_flops: float = 0.0,
) -> dict[str, Any]:
    """The record's ``virtual`` section: ``clusters`` {n: each part's seconds (``<part>_s``), ``decoder_s``,
    ``device_s`` per device k, ``total_s``}, ``server_s``, the ``slowest`` cluster and ``round_s`` = its total +
    ``server_s``, the ``server_scale`` the decoder's and the server's CPU seconds were multiplied by, and the
    ``host_flops`` the devices' scales were set against (so a record says which host speed its seconds came from).
    Empty when no CU reported a virtual clock."""
    if not (0.0 < server_scale < float("inf")):
        raise ValueError(f"server_scale must be finite and > 0, got {server_scale}")
    rows: dict[str, dict[str, Any]] = {}
    for n, report in sorted(clients.items()):
        clock = report.virtual
        if clock is None:
            continue
        decoder = float(decoder_cpu_s.get(int(n), 0.0)) * server_scale
        row: dict[str, Any] = {f"{part}_s": float(getattr(clock, part)) for part in PARTS}
        row["decoder_s"] = decoder
        row["device_s"] = list(clock.device)
        row["total_s"] = clock.cluster + decoder
        rows[str(n)] = row
    if not rows:
        return {}
    slowest = max(rows, key=lambda n: rows[n]["total_s"])
    server_s = float(server_cpu_s) * server_scale
    return {
        "clusters": rows,
        "server_s": server_s,
        "server_scale": float(server_scale),
        "host_flops": float(host_flops),
        "slowest": int(slowest),
        "round_s": rows[slowest]["total_s"] + server_s,
    }
