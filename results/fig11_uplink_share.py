"""Fig. 11's misses measured: the uplink share of each policy's round delay (eq. 26), optimizer only.

    python results/fig11_uplink_share.py [--rounds 150] [--seeds 0]

The same runs as ``fig11_policies.py`` (``collapipe_flwr.apps.simulate.run``: N = 10 CUs, J = 4 channels, BERT-small
classification workload, proxy losses for loss-only). Per round the delay is set by the slowest selected CU
(tau^pipe_n + uplink_n); this prints, per policy, the mean round delay, the share of the summed round delays
that is that bottleneck CU's uplink time and the mean number of CUs selected per round:
``mean_delay_s_<policy>``, ``mean_pipeline_s_<policy>``, ``mean_uplink_s_<policy>``, ``uplink_share_<policy>``,
``mean_selected_<policy>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fig7_8_methods import task_workload  # noqa: E402
from fig11_policies import PAPER, SETTING  # noqa: E402

from collapipe_flwr.apps.simulate import run  # noqa: E402
from collapipe_flwr.config import load_run_config  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args(argv)
    workload = task_workload("classification", SETTING)
    cfg = load_run_config(SETTING)
    for p in ("dssra", *PAPER):
        runs = [run(p, args.rounds, cfg.network, workload, cfg.scheduler, s) for s in args.seeds]
        pipe = statistics.fmean(x for r in runs for x in r["bottleneck_pipeline_s"])
        up = statistics.fmean(x for r in runs for x in r["bottleneck_uplink_s"])
        print(f"mean_delay_s_{p}: {pipe + up:.2f}")
        print(f"mean_pipeline_s_{p}: {pipe:.2f}")
        print(f"mean_uplink_s_{p}: {up:.2f}")
        print(f"uplink_share_{p}: {up / (pipe + up):.3f}")
        print(f"mean_selected_{p}: {statistics.fmean(x for r in runs for x in r['selected']):.2f}")


if __name__ == "__main__":
    main()
