"""How the planner and a round scale: the DSSRA solve at large (N, K, J), and a round's wall-clock, modelled delay
and server memory as N and K grow."""

from __future__ import annotations

from table_rows.row import Row


def dssra_rows(dssra_args: str) -> list[Row]:
    """One round of the DSSRA solve at (N, K, J) = (100, 10, 50) and (1000, 10, 200)."""
    big, huge = "N100_K10_J50", "N1000_K10_J200"
    return [
        Row(
            "DSSRA solve, (N, K, J) = (100, 10, 50), one round",
            lambda f: f[f"solve_ms_{big}"],
            "ms",
            150.0,
            f"python benchmarks/dssra_solve.py {dssra_args}",
        ),
        Row(
            "DSSRA solve, (N, K, J) = (1000, 10, 200), one round",
            lambda f: f[f"solve_ms_{huge}"],
            "ms",
            2000.0,
            f"python benchmarks/dssra_solve.py {dssra_args}",
        ),
    ]


def scaling_rows(scale_args: str) -> list[Row]:
    """Wall-clock per round as N (CUs) and K (devices per cluster) grow, the modelled delay (eq. 26) and the
    server's peak RSS; ``--quick`` runs the smaller sizes."""
    quick = "--quick" in scale_args.split()
    lo, hi = (3, 10) if quick else (3, 30)
    k_lo, k_hi = (3, 6) if quick else (2, 8)
    return [
        Row(
            f"wall-clock per round, N = {lo} CUs (K = 3, tiny model, 1 step)",
            lambda f: f[f"round_wall_s_N{lo}"],
            "s",
            None,
            f"python benchmarks/scaling.py {scale_args}",
        ),
        Row(
            f"wall-clock per round, N = {hi} CUs",
            lambda f: f[f"round_wall_s_N{hi}"],
            "s",
            None,
            f"python benchmarks/scaling.py {scale_args}",
        ),
        Row(
            f"wall-clock per round growth N = {lo} -> {hi}, per CU (1 = linear)",
            lambda f: f["round_wall_growth_per_cu_ratio"],
            "x",
            1.0,
            f"python benchmarks/scaling.py {scale_args}",
        ),
        Row(
            f"modelled round delay eq. (26), N = {lo} -> {hi}",
            lambda f: f[f"modelled_delay_s_N{hi}"] / f[f"modelled_delay_s_N{lo}"],
            "x",
            None,
            f"python benchmarks/scaling.py {scale_args}",
        ),
        Row(
            f"wall-clock per round, K = {k_lo} -> {k_hi} devices per cluster (N = 3)",
            lambda f: f[f"round_wall_s_K{k_hi}"] / f[f"round_wall_s_K{k_lo}"],
            "x",
            None,
            f"python benchmarks/scaling.py {scale_args}",
        ),
        Row(
            f"server peak RSS, N = {hi} vs N = {lo} (fixed model; flat = 1)",
            lambda f: f["server_rss_growth_ratio"],
            "x",
            1.1,
            f"python benchmarks/scaling.py {scale_args}",
        ),
    ]
