"""DSSRA solve time per round (Sub-1 for every cluster + Sub-2) for (N, K, J) = (3, 6, 4), (20, 8, 10),
(100, 10, 50) on the paper_table2 radio values. Prints `solve_ms_N{N}_K{K}_J{J}: value` (median of rounds
after one warm-up round, which compiles the CVXPY problem).

    python benchmarks/dssra_solve.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from collapipe_flwr.dssra.policies import make_policy
from collapipe_flwr.dssra.simulate import generic_workload, load_yaml
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import StateSampler

SIZES = ((3, 6, 4), (20, 8, 10), (100, 10, 50))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    workload = generic_workload(128, 4, 512, 6, 32, 64, 1)
    for N, K, J in SIZES:
        net = load_yaml("network", "paper_table2")
        net.update(num_channels=J, devices_per_cluster=K)
        spec = NetworkSpec.from_config(net, N)
        policy = make_policy(load_yaml("scheduler", "dssra"), spec, workload, 0)
        policy.Y[:] = 1.0  # non-zero queues: the power step goes through CVXPY, the costly path
        sampler = StateSampler(spec, 0)
        times = []
        for t in range(args.rounds + 1):
            state = sampler.sample(t)
            start = time.perf_counter()
            plan = policy.plan(t, state)
            times.append(time.perf_counter() - start)
        print(f"solve_ms_N{N}_K{K}_J{J}: {1000 * float(np.median(times[1:])):.1f}")


if __name__ == "__main__":
    main()
