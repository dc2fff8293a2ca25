"""C10 (eq. 27) and the Lyapunov queue (eq. 29) as the virtual-clock campaign's plans met them
(``results/virtual_paper_tables.py``'s "C10 and the queue" section).

Per job, over its selected CU-rounds: the mean of Gamma_n (eq. 28) against the Gamma^max it ran at, the share of
CU-rounds planned with Y_n > 0 (C10 behind), how often S = 1 was planned with Y_n > 0 and with Y_n = 0, and the
median virtual CU-round of each (what the queue's state cost in time). DSSRA minimises V tau + sum_n Y_n (S + p_n)
(eq. 32), so a positive queue pushes it to few segments; the other methods fix S (w/o SS and PipeLine: every device;
TITANIC and VanillaFL: S = 1) or plan it for delay alone (random: Sub-1 with V only, its channels drawn), so the
queue does not move their S and their Gamma_n may exceed Gamma^max. Beside the Gamma^max each job ran at, the one
docs/system_model.md's calibration gives for its own N, L and J (:func:`rule_gamma_max`): the campaign kept the
conf's value in every setting.
"""

from __future__ import annotations

import statistics

from reportlib import markdown as md
from reportlib.records import modelled


def c10_queue(records: list[dict]) -> dict[str, float | int | str]:
    """C10 (eq. 27: the mean of Gamma over the rounds <= Gamma^max) and the queue Y_n (eq. 29) the plans were made
    with, over the selected CU-rounds of the trained rounds: ``gamma_max``, ``gamma_mean`` (the mean of Gamma_n,
    eq. 28), ``cu_rounds``, ``y_positive_share`` (planned with Y_n > 0), ``s1_share_y_positive`` and
    ``s1_share_y_zero`` (S = 1 among those planned with Y_n > 0, with Y_n = 0; "" where there are none) and
    ``mean_m``; and ``cu_round_y_positive_s`` and ``cu_round_y_zero_s``, the median virtual CU-round (the
    cluster's ``virtual.clusters[n].total_s``: its devices, links, CU, uplink, decoder share and set-up) of those
    planned with Y_n > 0 and with Y_n = 0 ("" where none or without a virtual clock)."""
    gammas: list[float] = []
    seconds: dict[bool, list[float]] = {True: [], False: []}
    ones = {True: 0, False: 0}
    counts = {True: 0, False: 0}
    ms: list[int] = []
    gamma_max = float("nan")
    for record in records:
        plan, model = record.get("plan") or {}, modelled(record)
        if record.get("round", 0) < 1 or model is None:
            continue
        gamma_max = model.gamma_max
        for cluster, figures in zip(plan.get("clusters", []), model.clusters):
            if not cluster.get("selected"):
                continue
            behind = figures.Y > 0
            counts[behind] += 1
            ones[behind] += int(cluster["S"]) == 1
            gammas.append(figures.gamma)
            ms.append(int(cluster["m"]))
            clock = ((record.get("virtual") or {}).get("clusters") or {}).get(str(cluster["cluster"]))
            if clock is not None:
                seconds[behind].append(float(clock["total_s"]))
    total = counts[True] + counts[False]

    def share(k: int, n: int) -> float | str:
        return round(k / n, 3) if n else ""

    return {
        "gamma_max": round(gamma_max, 3),
        "gamma_mean": round(statistics.mean(gammas), 3) if gammas else "",
        "cu_rounds": total,
        "y_positive_share": share(counts[True], total),
        "s1_share_y_positive": share(ones[True], counts[True]),
        "s1_share_y_zero": share(ones[False], counts[False]),
        "mean_m": round(statistics.mean(ms), 2) if ms else "",
        "cu_round_y_positive_s": round(statistics.median(seconds[True]), 2) if seconds[True] else "",
        "cu_round_y_zero_s": round(statistics.median(seconds[False]), 2) if seconds[False] else "",
    }


def rule_gamma_max(overrides: list[str]) -> float:
    """Gamma^max by the reading the conf's 3.5 was calibrated with (``scheduler.convergence.gamma_max=auto``:
    ``dssra.policies.convergence_params``, docs/system_model.md) for the job's own N, L, J and network: what C10
    would have been had the campaign recomputed it per setting, as the docs ask. The campaign kept the conf's 3.5
    everywhere."""
    from collapipe_flwr.config.load import load_run_config
    from collapipe_flwr.dssra.policies import convergence_params

    cfg = load_run_config([*overrides, "scheduler.convergence.gamma_max=auto"])
    return round(convergence_params(cfg.scheduler, cfg.network, cfg.model.encoder_blocks).gamma_max, 3)


def table_lines(rows: list[dict]) -> list[str]:
    """The C10 section: per job, mean Gamma_n against Gamma^max and the plans' S = 1 share by the queue's state."""
    lines = [
        "",
        "C10 and the queue (the selected CU-rounds: mean Gamma_n, eq. 28, against Gamma^max; the share planned with "
        "Y_n > 0, eq. 29; S = 1 among those planned with Y_n > 0 and with Y_n = 0; DSSRA minimises "
        "V tau + sum_n Y_n (S + p_n), eq. 32; the other methods fix S or, as random, plan it for delay alone, so the "
        "queue does not move their S). "
        "Gamma^max: what the job ran at (the six methods' jobs: the conf's); \"by the docs' rule\": what "
        "docs/system_model.md's calibration "
        "(1.07 x the fair-share Gamma at S = 1, P^max and the mean channel) gives for the job's own N, L and J. "
        "CU-round s: the median virtual CU-round (the cluster's whole part of its round) of those planned with "
        "Y_n > 0 and with Y_n = 0:",
        "",
        *md.head(
            "| part | setting | seed | run | CU-rounds | mean Gamma_n | Gamma^max | by the docs' rule | Y_n > 0 "
            "| S = 1 when Y_n > 0 | S = 1 when Y_n = 0 | mean m | CU-round s, Y_n > 0 | CU-round s, Y_n = 0 |"
        ),
    ]
    for r in rows:
        cells = (r["cu_rounds"], r["gamma_mean"], r["gamma_max"], r["rule_gamma_max"], r["y_positive_share"])
        cells += (r["s1_share_y_positive"] if r["s1_share_y_positive"] != "" else "-",)
        cells += (r["s1_share_y_zero"] if r["s1_share_y_zero"] != "" else "-", r["mean_m"])
        cells += tuple(r[k] if r[k] != "" else "-" for k in ("cu_round_y_positive_s", "cu_round_y_zero_s"))
        lines.append(md.row((r["part"], r["setting"], r["seed"], r["run"], *cells)))
    return lines
