#!/usr/bin/env bash
# Regenerates results/: the paper's default setting (N = 3 clusters, K = 6 devices, J = 4 channels, Table II
# preset) in Algorithm 1's round (federation=paper: one pipelined batch per round, then the upload of z_enc and
# theta_enc only; eq. 11), every table with three seeds.
#   1. results/optimizer_figures.sh: the figures the paper states in the system model (Figs. 4, 5, 7-8, 11,
#      Table III, the Lyapunov queues and the V trade-off, the sensitivities), the optimizer alone, about 15 minutes;
#   2. results/training_runs.sh: training through the same Flower simulation path as `flwr run .` (one
#      `flwr run` per Hydra job): the five methods on the three tasks, seeds 0, 1, 2, and the (S, m) grids of
#      Figs. 9-10 (about 2 minutes per job on 2 cores: close to 2 h 45 min);
#   3. results/fig6_learning.py: Figs. 6, 9-10 as tables (mean +- sd over seeds), runs.csv and PNGs in
#      results/training/ (`python -m collapipe_flwr.experiments.report SWEEP_ROOT/<task>` gives any task's
#      per-run report on top).
# Usage: bash results/reproduce.sh [SWEEP_ROOT]   (data: ./data, or COLLAPIPE_DATA_DIR; docs/data.md)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${1:-/tmp/collapipe-repro}"
bash results/optimizer_figures.sh
bash results/training_runs.sh "$ROOT"
mkdir -p results/training
python results/fig6_learning.py "$ROOT" --out results/training | tee results/training/figures.txt
