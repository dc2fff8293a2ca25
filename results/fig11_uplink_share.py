"""Fig. 11's misses measured: the uplink share of each policy's round delay (eq. 26), optimizer only.

    python results/fig11_uplink_share.py [--rounds 150] [--seeds 0]

Same setting and the same round loop as ``collapipe_flwr.simulate.run`` (``fig11_policies.py``: N = 10 CUs,
J = 4 channels, BERT-small classification workload, proxy losses for loss-only). Per round the delay is set by
the slowest selected CU (tau^pipe_n + uplink_n); this prints, per policy, the mean round delay and the share of
the summed round delays that is that bottleneck CU's uplink time: ``uplink_share_<policy>``,
``mean_delay_s_<policy>``, ``mean_pipeline_s_<policy>``, ``mean_uplink_s_<policy>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fig7_8_methods import task_workload  # noqa: E402
from fig11_policies import PAPER, SETTING  # noqa: E402

from collapipe_flwr.config import load_run_config  # noqa: E402
from collapipe_flwr.dssra.policies import make_policy  # noqa: E402
from collapipe_flwr.system.state import StateSampler  # noqa: E402


def bottleneck_parts(policy_name: str, rounds: int, cfg, workload, seed: int) -> tuple[float, float]:
    """Summed (tau^pipe, uplink) of each round's slowest selected CU, as simulate.run drives the policy."""
    sched = dataclasses.replace(cfg.scheduler, name=policy_name)
    policy = make_policy(sched, cfg.network, workload, seed)
    sampler = StateSampler(cfg.network, seed)
    rng = np.random.default_rng([seed, 77])
    difficulty = rng.uniform(1.0, 3.0, cfg.network.num_clusters)
    trained = np.zeros(cfg.network.num_clusters)
    pipe_sum = up_sum = 0.0
    for t in range(rounds):
        plan = policy.plan(t, sampler.sample(t))
        for c in plan.selected:
            trained[c.cluster] += 1
        losses = {
            c.cluster: float(1.0 + difficulty[c.cluster] * np.exp(-trained[c.cluster] / 10) + rng.normal(0, 0.02))
            for c in plan.selected
        }
        policy.observe(plan, losses)
        rows = [r for r in plan.modelled["clusters"] if r["delay_s"] > 0]
        if rows:
            worst = max(rows, key=lambda r: r["delay_s"])
            pipe_sum += worst["pipeline_s"]
            up_sum += worst["uplink_s"]
    return pipe_sum, up_sum


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args(argv)
    workload = task_workload("classification", SETTING)
    cfg = load_run_config(SETTING)
    for p in ("dssra", *PAPER):
        parts = [bottleneck_parts(p, args.rounds, cfg, workload, s) for s in args.seeds]
        pipe = sum(x for x, _ in parts) / (args.rounds * len(parts))
        up = sum(y for _, y in parts) / (args.rounds * len(parts))
        print(f"mean_delay_s_{p}: {pipe + up:.2f}")
        print(f"mean_pipeline_s_{p}: {pipe:.2f}")
        print(f"mean_uplink_s_{p}: {up:.2f}")
        print(f"uplink_share_{p}: {up / (pipe + up):.3f}")


if __name__ == "__main__":
    main()
