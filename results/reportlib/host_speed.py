"""Records of the virtual clock read at one host speed, whichever host ran them.

Before ``clock.server_flops`` and ``clock.cu_flops`` (docs/testbed.md, "The server's and the CUs' speeds") the
virtual clock kept the server's and the CUs' own work at the host's own seconds: the decoder's head steps
(``decoder_s``), the plan and aggregation (``server_s``), the CU's embedding (``cu_s``) and a round's set-up
(``setup_s``). Only the devices' compute was set against the host's speed. Such a record depends on the host: on
one 4x slower per thread, TITANIC's decoder term was 8.5 s a round against 2.2-2.4 s.

:func:`at_reference` rewrites such a record's ``virtual`` section as the current clock writes it, with those four
terms x host_flops / the configured rate (``conf/clock/virtual.yaml``), the clusters' totals, the slowest cluster and
the round recomputed. A record that carries ``virtual.server_scale`` was written by the current clock and is left
as it is.

The old records do not keep the host's FLOP rate, so :func:`recovered_host_flops` reads it back from the
devices: a device's virtual seconds over its compute seconds (``device-compute-seconds``) is host_flops / phi_k
f_k, and phi_k f_k is the job's own network draw (``conf/network/<name>.yaml`` at the job's ``network.*`` values
and N). The median over every device of every round is the estimate. Those compute seconds are the stage's wall
seconds, not its CPU seconds, so the read-back holds only for a job that ran alone: :func:`check_spread` refuses an
estimate whose devices disagree, which is what contention (about a third of the first campaign's jobs shared the
machine), a changed draw or a wrong network show.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from collapipe_flwr.system.network import NetworkSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
OWN_CU_PARTS = ("cu_s", "setup_s")
# a recovered host speed whose middle half of devices spans more than this (relative to its median) is refused
MAX_SPREAD = 0.15
# a session whose host speed is further than this from the translation part's kept jobs' (read back from their
# devices, wall seconds: 61-92e9 FLOP/s on one kind of host) adds none to that part's code version
SAME_HOST = 0.20
# a job whose clock-written host speed is further than this from its seed's median is set against another speed
# than the seed's other methods: another host, or an outlier of the start-up probe (one reading: 30 readings in one
# process under a running job spanned 24.3-26.6e9, fresh processes 23.8-26.3e9, one job's start-up 21.1e9)
SAME_SPEED = 0.10


def reference_rates(conf: Path = CONF) -> tuple[float, float]:
    """(server_flops, cu_flops) of ``conf/clock/virtual.yaml``: the speeds the records are read at."""
    clock = yaml.safe_load((conf / "clock" / "virtual.yaml").read_text(encoding="utf-8"))
    return float(clock["server_flops"]), float(clock["cu_flops"])


def job_network(overrides: Sequence[str], conf: Path = CONF) -> NetworkSpec:
    """The network a job drew its devices from: ``network=``, its top-level ``network.<key>=`` values (the seed, J)
    and ``federation.num_clusters=`` of its status.json overrides (N = 3 when absent, the config's default)."""
    given = dict(item.split("=", 1) for item in overrides if "=" in item)
    raw = yaml.safe_load((conf / "network" / f"{given.get('network', 'paper_table2')}.yaml").read_text())
    for key, value in given.items():
        name = key.removeprefix("network.")
        if key.startswith("network.") and "." not in name:
            raw[name] = yaml.safe_load(value)
    return NetworkSpec.from_config(raw, int(given.get("federation.num_clusters", 3)))


def device_speed_ratios(records: Sequence[Mapping[str, Any]], network: NetworkSpec) -> list[float]:
    """host_flops read off each device of each round: its virtual seconds / CPU seconds x its phi_k f_k."""
    out = []
    for record in records:
        clusters = (record.get("virtual") or {}).get("clusters") or {}
        for n, report in (record.get("clients") or {}).items():
            virtual = clusters.get(str(n))
            if virtual is None:
                continue
            for k, (cpu, seconds) in enumerate(zip(report.get("device-compute-seconds", ()), virtual["device_s"])):
                if cpu > 0 and seconds > 0:
                    out.append(seconds / cpu * network.devices[int(n)][k].flops_per_second)
    return out


def check_spread(ratios: Sequence[float], where: str) -> float:
    """The median of ``ratios``; refuses ratios whose middle half spans more than MAX_SPREAD of it."""
    if len(ratios) < 4:
        raise ValueError(f"{where}: {len(ratios)} device readings, too few to read the host's speed back")
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    if (q3 - q1) / median > MAX_SPREAD:
        raise ValueError(
            f"{where}: the devices disagree on the host's speed ({q1:.3g}-{q3:.3g} FLOP/s, middle half); "
            "the job's network draw is not the one its devices ran on"
        )
    return median


def recovered_host_flops(records: Sequence[Mapping[str, Any]], overrides: Sequence[str], where: str) -> float:
    """The host speed an old record's devices were set against (see the module docstring). Refused for VanillaFL,
    whose devices train the whole encoder as data users: their compute seconds agree among themselves but read the
    host about 2x fast (153-162e9 FLOP/s beside its seeds' 67-92e9)."""
    if "method=vanilla_fl" in overrides:
        raise ValueError(f"{where}: VanillaFL's devices train as data users; they do not read the host's speed back")
    return check_spread(device_speed_ratios(records, job_network(overrides)), where)


def written_at_speeds(record: Mapping[str, Any]) -> bool:
    """Whether the record's virtual section was written by the clock that sets own work against its speeds."""
    return "server_scale" in (record.get("virtual") or {})


def at_reference(record: Mapping[str, Any], host_flops: float, server_flops: float, cu_flops: float) -> dict:
    """The record with its ``virtual`` section as the current clock would write it on a host of ``host_flops``:
    ``cu_s`` and ``setup_s`` x host_flops / cu_flops, ``decoder_s`` and ``server_s`` x host_flops / server_flops;
    totals, the slowest cluster and ``round_s`` recomputed. Records already written so are returned unchanged."""
    virtual = record.get("virtual") or {}
    if not virtual.get("clusters") or written_at_speeds(record):
        return dict(record)
    cu, server = host_flops / cu_flops, host_flops / server_flops
    out = copy.deepcopy(dict(record))
    rows = out["virtual"]["clusters"]
    for row in rows.values():
        own_cu = sum(row[p] for p in OWN_CU_PARTS)
        row["total_s"] += own_cu * (cu - 1.0) + row["decoder_s"] * (server - 1.0)
        for p in OWN_CU_PARTS:
            row[p] *= cu
        row["decoder_s"] *= server
    slowest = max(rows, key=lambda n: rows[n]["total_s"])
    server_s = float(virtual["server_s"]) * server
    out["virtual"].update(
        server_s=server_s,
        slowest=int(slowest),
        round_s=rows[slowest]["total_s"] + server_s,
        server_scale=server,
        host_flops=host_flops,
    )
    return out


def clock_wrote_speed(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every timed round of a job was written by the clock that records its host speed
    (:func:`written_at_speeds`)."""
    timed = [r for r in records if (r.get("virtual") or {}).get("clusters")]
    return bool(timed) and all(written_at_speeds(r) for r in timed)


def job_host_flops(records: Sequence[Mapping[str, Any]], overrides: Sequence[str], where: str) -> float:
    """The host speed a job's virtual clock was set against: ``virtual.host_flops`` where the clock wrote it (the
    median over its rounds of the speed each used: the start-up reading, or with ``clock.probe_every_round`` the
    median of the readings so far), else read back from its devices (:func:`recovered_host_flops`,
    which raises ValueError where they disagree)."""
    timed = [r for r in records if (r.get("virtual") or {}).get("clusters")]
    if clock_wrote_speed(timed):
        return statistics.median(float(r["virtual"]["host_flops"]) for r in timed)
    return recovered_host_flops(timed, overrides, where)


def off_speed(speed: float, reference: float) -> bool:
    """Whether ``speed`` is more than SAME_SPEED from ``reference`` (relative to it)."""
    return abs(speed / reference - 1.0) > SAME_SPEED


def two_hosts(speeds: Sequence[float]) -> bool:
    """Whether host speeds span more than SAME_HOST: the fastest over the slowest, less 1."""
    return len(speeds) > 1 and max(speeds) / min(speeds) - 1.0 > SAME_HOST


def records_at_reference(
    records: Sequence[Mapping[str, Any]], overrides: Sequence[str], where: str
) -> tuple[list[dict], float]:
    """A job's records read at the reference speeds (:func:`at_reference`), and the host speed they were read from
    (:func:`job_host_flops`)."""
    host_flops = job_host_flops(records, overrides, where)
    if clock_wrote_speed(records):
        return [dict(r) for r in records], host_flops
    server_flops, cu_flops = reference_rates()
    return [at_reference(r, host_flops, server_flops, cu_flops) for r in records], host_flops
