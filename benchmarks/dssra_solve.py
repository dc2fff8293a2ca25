"""DSSRA solve time per round (block coordinate descent of Sub-1 for every cluster and Sub-2: Dinkelbach + SCA
power for every (CU, channel) pair, Hungarian matching) for (N, K, J) = (3, 6, 4), (20, 8, 10), (100, 10, 50),
(1000, 10, 200) on the paper_table2 radio values, with non-zero queues (Y_n = 1). Targets (issue 30, default
drift): (100, 10, 50) <= 150 ms, (1000, 10, 200) <= 2 s (benchmarks/run_all.py judges them). Prints
`name: value` lines:

* solve_ms_N{N}_K{K}_J{J}: median over the rounds after one warm-up round (which compiles the CVXPY
  problem), default scheduler (drift: gamma). There the power objective is non-increasing in p, so
  Dinkelbach's test F(lambda) = 0 already holds at its warm start (the largest C6/C8'-feasible power).
* solve_ms_N{N}_K{K}_J{J}_drift_paper: the same with drift: paper (Y_n p_n of eq. 32), where every pair
  runs the Dinkelbach + SCA iterations through CVXPY (at (1000, 10, 200) this takes most of the run).
* cvxpy_solves_..._drift_paper, bcd_passes_...: work done in the last measured round.

    python benchmarks/dssra_solve.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from collapipe_flwr.apps.simulate import generic_workload
from collapipe_flwr.config import load_run_config
from collapipe_flwr.dssra import dinkelbach
from collapipe_flwr.dssra.policies import make_policy
from collapipe_flwr.system.state import StateSampler

SIZES = ((3, 6, 4), (20, 8, 10), (100, 10, 50), (1000, 10, 200))


class _CountSolves:
    """Counts CVXPY surrogate solves (Dinkelbach/SCA iterations) during a round."""

    def __init__(self) -> None:
        self.count = 0
        self._inner = dinkelbach._solve_surrogate

    def __enter__(self):
        def counted(*a, **k):
            self.count += 1
            return self._inner(*a, **k)

        dinkelbach._solve_surrogate = counted
        return self

    def __exit__(self, *exc) -> None:
        dinkelbach._solve_surrogate = self._inner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", default=[], metavar="N,K,J", help="instead of the four default sizes")
    ap.add_argument("--drifts", nargs="+", default=["gamma", "paper"], choices=("gamma", "paper"))
    args = ap.parse_args()
    try:
        sizes = [tuple(int(x) for x in size.split(",")) for size in args.sizes] or list(SIZES)
    except ValueError:
        ap.error("--sizes takes N,K,J triples, e.g. --sizes 100,10,50 1000,10,200")
    workload = generic_workload(128, 4, 512, 6, 32, 64, 1)
    for drift in args.drifts:
        suffix = "" if drift == "gamma" else "_drift_paper"
        for N, K, J in sizes:
            cfg = load_run_config(
                [
                    "network=paper_table2",
                    f"network.num_channels={J}",
                    f"network.devices_per_cluster={K}",
                    f"federation.num_clusters={N}",
                    "scheduler=dssra",
                    f"scheduler.drift={drift}",
                ]
            )
            policy = make_policy(cfg.scheduler, cfg.network, workload, 0)
            spec = cfg.network
            policy.Y[:] = 1.0  # non-zero queues: the drift terms are live
            sampler = StateSampler(spec, 0)
            times = []
            for t in range(args.rounds + 1):
                state = sampler.sample(t)
                with _CountSolves() as counter:
                    start = time.perf_counter()
                    plan = policy.plan(t, state)
                    times.append(time.perf_counter() - start)
            name = f"N{N}_K{K}_J{J}{suffix}"
            print(f"solve_ms_{name}: {1000 * float(np.median(times[1:])):.1f}")
            print(f"cvxpy_solves_{name}: {counter.count}")
            print(f"bcd_passes_{name}: {plan.modelled.bcd_iterations}")


if __name__ == "__main__":
    main()
