#!/usr/bin/env bash
# Optimizer-only figures (no training; about 15 minutes on 2 cores), each folder with its PNGs, CSV and the
# printed `name: value` figures (figures.txt):
#   fig4/    Fig. 4: round delay over S x m with an even delta (the paper's Transformer, a Table II cluster)
#   fig5/    Fig. 5: each heterogeneous cluster's optimal (S, m) and delay over m, beside the uniform split
#   fig7_8/  Figs. 7-8 and Table III: on-device accumulated computation time, per-device memory and data users
#            of every method, per task, 3 seeds, 50 rounds of Algorithm 1; <task>/ with the small models the
#            training runs use, <task>_paper_size/ with the paper's Transformer and BERT-base;
#            device_spread_<task>_paper_size/: the margins as the device spread inside a cluster narrows
#   fig11/   Fig. 11: DSSRA vs loss-only / delay-only / random with CU selection (N = 10 > J = 4), 3 seeds;
#            uplink_share.txt: each policy's round delay split into tau^pipe and uplink (seed 0);
#            bandwidth/: the margins with the uplink bandwidth B_n^U scaled x1-x1000, 3 seeds
#   lyapunov/default, lyapunov/selection: Y_n over rounds and the V trade-off (V = 0.01, 1, 10, 100)
#   selection/: every policy's cumulative delay and convergence term on the selection network, seed 0
# Gamma^max for N = 10, J = 4 is 0.95 (1.07 x fair_share_gamma, docs/system_model.md); the default 3.5 is for
# N = 2, J = 2.
set -euo pipefail
cd "$(dirname "$0")/.."
run() {  # run OUT_DIR command...: the command's stdout also goes to OUT_DIR/figures.txt
  local out=$1
  shift
  mkdir -p "$out"
  "$@" | tee "$out/figures.txt"
}
run results/fig4 python results/fig4_uniform_grid.py --out results/fig4
run results/fig5 python results/fig5_segments.py --out results/fig5
for task in translation classification ner; do  # the small models the training runs use
  run results/fig7_8/$task python results/fig7_8_methods.py --task $task --rounds 50 --seeds 0 1 2 --out results/fig7_8/$task
done
# The paper's model sizes: Fig. 7's Transformer (L = 6, d_model 512) and Fig. 8's BERT-base (L = 12, hidden 768).
# BERT-base gives every device 6 GB (classification) or 8 GB (NER, 160-token sentences): Table III has VanillaFL's
# devices hold the whole model (~5-6 GB), which Table II's gamma_k^max = 1.5 GB forbids (C7), so the paper's
# VanillaFL ran on larger devices.
run results/fig7_8/translation_paper_size python results/fig7_8_methods.py --task translation --model transformer_paper \
  --rounds 50 --seeds 0 1 2 --out results/fig7_8/translation_paper_size
for task_memory in classification:6e9 ner:8e9; do
  task=${task_memory%:*}
  run results/fig7_8/${task}_paper_size python results/fig7_8_methods.py --task $task --model bert_base --rounds 50 \
    --seeds 0 1 2 --out results/fig7_8/${task}_paper_size network.device.memory_bytes=${task_memory#*:}
done
# Sensitivity: the same Fig. 7 with a narrow device spread inside each cluster (f_k 0.6-0.8 GHz, phi_k 20-24
# instead of Table II's 0.1-0.8 GHz and 10-24), results/README.md
run results/fig7_8/translation_paper_size_narrow_devices python results/fig7_8_methods.py --task translation \
  --model transformer_paper --rounds 50 --seeds 0 1 2 --out results/fig7_8/translation_paper_size_narrow_devices \
  "network.device.f_hz=[6.0e+8,8.0e+8]" "network.device.flops_per_cycle=[20.0,24.0]"
# Sensitivity: Figs. 7-8 at the paper's sizes with the device spread narrowed step by step (a = 0: Table II; a = 1:
# the narrow setting above), results/README.md
run results/fig7_8/device_spread_translation_paper_size python results/fig7_8_device_spread.py --task translation \
  --model transformer_paper --out results/fig7_8/device_spread_translation_paper_size
run results/fig7_8/device_spread_classification_paper_size python results/fig7_8_device_spread.py \
  --task classification --model bert_base --out results/fig7_8/device_spread_classification_paper_size \
  network.device.memory_bytes=6e9
run results/fig11 python results/fig11_policies.py --rounds 150 --seeds 0 1 2 --out results/fig11
python results/fig11_uplink_share.py --rounds 150 --seeds 0 | tee results/fig11/uplink_share.txt
# Sensitivity: the same Fig. 11 with B_n^U scaled x1-x1000 (the uplink's share of the round from 92% to 1%)
run results/fig11/bandwidth python results/fig11_bandwidth.py --rounds 150 --seeds 0 1 2 --out results/fig11/bandwidth
run results/lyapunov/default python results/lyapunov.py --rounds 150 --out results/lyapunov/default
run results/lyapunov/selection python results/lyapunov.py --rounds 150 --out results/lyapunov/selection \
  network=selection federation.num_clusters=10 scheduler.convergence.gamma_max=0.95
run results/selection python -m collapipe_flwr.apps.simulate --rounds 150 --out results/selection --network selection \
  --clusters 10 --policies dssra,loss_only,delay_only,random --layers 3 --d-model 256 --d-ff 512 --seq-len 64 \
  scheduler.convergence.gamma_max=0.95
