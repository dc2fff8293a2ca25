"""The virtual clock against the testbed's measured rounds, from the kept records of
``results/virtual_clock_check.py`` (``results/virtual_clock/records/*.rounds.jsonl.gz``): writes
``results/virtual_clock/table.md``.

Per CU-round (one cluster's round, the unit the clock computes):

* **steps**: the CU's local steps and its upload as measured (``seconds-train`` + ``seconds-upload``, wall) against
  the same on the virtual clock (the devices' critical path, the D2D hand-overs, the CU's embedding, the uplink at
  R_n, and the server decoder's CPU for that cluster: ``virtual`` in rounds.jsonl, set-up left out on both sides,
  since the clock takes the measured set-up as it is);
* **eq. (26)**: the plan's modelled delay of that cluster (``modelled.clusters[n].delay_s``) against the same
  measured steps, as the figure the virtual clock is meant to improve on;
* two of the clock's parts against their measured counterparts: per device-round, a device's scaled CPU seconds
  (``virtual.clusters[n].device_s``) against the wall seconds of its forwards and backwards under its quota
  (``device-compute-seconds``); per CU-round, the uplink at R_n against what the testbed's bucket held
  (``seconds-uplink-wait`` + ``seconds-upload``).

Relative error = (clock - measured) / measured; the table gives the number of CU-rounds, the median and 90th
percentile of |error| and the median signed error, and the median share of each virtual part.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from reportlib import markdown as md  # results/, first on sys.path when run as a script
from reportlib.records import modelled, read_jsonl_gz

RESULTS = Path(__file__).resolve().parent
RECORDS = RESULTS / "virtual_clock" / "records"
OUT = RESULTS / "virtual_clock" / "table.md"
PARTS = ("compute_s", "d2d_s", "cu_s", "uplink_s", "decoder_s")


def cu_rounds(records: list[dict]) -> list[dict]:
    """One row per trained CU-round: measured steps, virtual steps by part, eq. (26)'s delay."""
    rows = []
    for record in records:
        virtual = (record.get("virtual") or {}).get("clusters") or {}
        plan = modelled(record)
        eq26 = plan.clusters if plan else ()
        for n, metrics in (record.get("clients") or {}).items():
            if n not in virtual or int(metrics.get("steps", 0)) == 0:
                continue
            measured = float(metrics["seconds-train"]) + float(metrics.get("seconds-upload", 0.0))
            parts = {part: float(virtual[n][part]) for part in PARTS}
            rows.append(
                {
                    "round": int(record["round"]),
                    "cluster": int(n),
                    "measured_s": measured,
                    "virtual_s": sum(parts.values()),
                    "eq26_s": eq26[int(n)].delay_s if int(n) < len(eq26) else float("nan"),
                    **parts,
                }
            )
    return rows


def device_rounds(records: list[dict]) -> list[tuple[float, float]]:
    """(virtual, measured) per device-round of a device that computed: its scaled CPU seconds (``device_s``)
    against the wall seconds of its forwards and backwards under its quota (``device-compute-seconds``)."""
    pairs = []
    for record in records:
        virtual = (record.get("virtual") or {}).get("clusters") or {}
        for n, metrics in (record.get("clients") or {}).items():
            if n not in virtual:
                continue
            for v, m in zip(virtual[n]["device_s"], metrics.get("device-compute-seconds", [])):
                if m > 0:
                    pairs.append((float(v), float(m)))
    return pairs


def uplink_rounds(records: list[dict]) -> list[tuple[float, float]]:
    """(virtual, measured) per CU-round: the uplink at R_n against what the testbed's bucket held (z^enc's wait and
    the weights' upload)."""
    pairs = []
    for record in records:
        virtual = (record.get("virtual") or {}).get("clusters") or {}
        for n, metrics in (record.get("clients") or {}).items():
            measured = float(metrics.get("seconds-uplink-wait", 0.0)) + float(metrics.get("seconds-upload", 0.0))
            if n in virtual and measured > 0:
                pairs.append((float(virtual[n]["uplink_s"]), measured))
    return pairs


def pair_errors(pairs: list[tuple[float, float]]) -> list[float]:
    return [(v - m) / m for v, m in pairs]


def errors(rows: list[dict], key: str) -> list[float]:
    return [(r[key] - r["measured_s"]) / r["measured_s"] for r in rows if r["measured_s"] > 0]


def summary_line(name: str, errs: list[float]) -> str:
    absolute = np.abs(np.asarray(errs))
    median, p90 = 100 * float(np.median(absolute)), 100 * float(np.percentile(absolute, 90))
    return md.row((name, len(errs), f"{median:.1f}%", f"{p90:.1f}%", f"{100 * statistics.median(errs):+.1f}%"))


def plan_of(path: Path) -> str:
    """The plan a record ran (``virtual_clock_check.VARIANTS``): ``s0`` is DSSRA's, ``s0_pipeline`` PipeLine's."""
    stem = path.name.split(".")[0]
    return stem.split("_", 1)[1] if "_" in stem else "dssra"


def group_lines(label: str, loaded: list[list[dict]]) -> list[str]:
    """The four comparisons over one group of records, each row named with ``label``."""
    rows = [row for records in loaded for row in cu_rounds(records)]
    if not rows:
        return []
    devices = [pair for records in loaded for pair in device_rounds(records)]
    uplinks = [pair for records in loaded for pair in uplink_rounds(records)]
    lines = [
        summary_line(f"{label}: virtual clock, a CU-round's steps and upload", errors(rows, "virtual_s")),
        summary_line(f"{label}: eq. (26), the same", errors(rows, "eq26_s")),
    ]
    if devices:
        lines.append(
            summary_line(f"{label}: virtual compute, a device-round (CPU / quota vs wall)", pair_errors(devices))
        )
    if uplinks:
        lines.append(summary_line(f"{label}: virtual uplink, a CU-round (R_n vs the bucket)", pair_errors(uplinks)))
    return lines


def share_line(label: str, loaded: list[list[dict]]) -> str:
    rows = [row for records in loaded for row in cu_rounds(records)]
    shares = [f"{100 * statistics.median(r[p] / r['virtual_s'] for r in rows):.1f}%" for p in PARTS]
    return md.row((label, *shares))


def table(records_dir: Path = RECORDS) -> str:
    files = sorted(records_dir.glob("*.rounds.jsonl.gz"))
    groups: dict[str, list[list[dict]]] = {}
    for path in files:
        groups.setdefault(plan_of(path), []).append(read_jsonl_gz(path))
    head = [
        "# The virtual clock against the testbed (generated by results/virtual_clock_tables.py)",
        "",
        f"Records: {', '.join(f'`virtual_clock/records/{p.name}`' for p in files)} "
        "(`python results/virtual_clock_check.py ROOT`). Per plan (DSSRA's, PipeLine's): its CU-rounds' local steps "
        "and upload as the testbed measured them (wall) against the same on the clock, eq. (26) against the same, "
        "and two of the clock's parts against their measured counterparts; relative error = (clock - measured) / "
        "measured.",
        "",
        *md.head("| comparison | rounds | median abs. error | p90 abs. error | median signed error |"),
    ]
    body = [line for plan, loaded in sorted(groups.items()) for line in group_lines(plan, loaded)]
    if not body:
        return "\n".join([*head, "| (no records yet) | 0 | - | - | - |"]) + "\n"
    shares = ["", "Median share of each virtual part in the virtual steps:", "", *md.head(md.row(("plan", *PARTS)))]
    shares += [share_line(plan, loaded) for plan, loaded in sorted(groups.items())]
    return "\n".join([*head, *body, *shares]) + "\n"


def main() -> None:
    md.write(OUT, table())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
