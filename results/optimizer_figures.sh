#!/usr/bin/env bash
# Optimizer-only figures (no training, a few minutes on 2 cores): Fig. 5 per-cluster (S, m) (results/fig5_segments.py), the Lyapunov queues and the V trade-off
# (results/lyapunov.py) in the default setting and with CU selection (N = 10 > J = 4), and Fig. 11's
# policy comparison on the selection network (python -m collapipe_flwr.simulate). Gamma^max for N = 10,
# J = 4 is 0.95 (1.07 x fair_share_gamma, docs/system_model.md); the default 3.5 is for N = 2, J = 2.
set -euo pipefail
cd "$(dirname "$0")/.."
python results/fig4_uniform_grid.py --out results/fig4
python results/fig5_segments.py --out results/fig5
python results/lyapunov.py --rounds 150 --out results/lyapunov/default
python results/lyapunov.py --rounds 150 --out results/lyapunov/selection network=selection federation.num_clusters=10 \
  scheduler.convergence.gamma_max=0.95
python -m collapipe_flwr.simulate --rounds 150 --out results/selection --network selection --clusters 10 \
  --policies dssra,loss_only,delay_only,random --layers 3 --d-model 256 --d-ff 512 --seq-len 64 \
  scheduler.convergence.gamma_max=0.95
# Figs. 7-8: on-device accumulated computation time per method, per task (3 seeds, 50 rounds of one batch)
for task in translation classification ner; do
  python results/fig7_8_methods.py --task $task --rounds 50 --seeds 0 1 2 --out results/fig7_8/$task
done
# Fig. 11 over 3 seeds: DSSRA vs loss-only / delay-only / random with CU selection (N = 10 > J = 4)
python results/fig11_policies.py --rounds 150 --seeds 0 1 2 --out results/fig11
