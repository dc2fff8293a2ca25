#!/usr/bin/env bash
# Training runs for Figs. 6, 9 and 10 (and the learning side of every method), through the same Flower
# simulation path as `flwr run .` (one `flwr run` per Hydra job), in Algorithm 1's round (federation=paper:
# one pipelined batch per round, frozen embedding, z_enc + theta_enc uploaded; eq. 11), on the Table II network
# (N = 3, K = 6, J = 4) with the small models. Parts, run in this order so that a cut-short run still has every
# task at seed 0:
#   methods SEED : the five methods (CollaPipe, w/o SS, VanillaFL, TITANIC, PipeLine) on the three tasks;
#   grid         : Figs. 9-10, translation and NER over (S, m) with a uniform split (S = K devices per cluster,
#                  m fixed), seed 0;
#   long         : Fig. 6c's comparison (CollaPipe vs PipeLine and TITANIC) on classification for 150 rounds,
#                  seed 0, so that the accuracy leaves the untrained level (about 7 minutes a job).
# Usage: bash results/training_runs.sh ROOT [PART ...]   (default parts: methods0 grid methods1 methods2 long)
# Then: python results/fig6_learning.py ROOT --out results/training   (tables and figures, mean +- sd over seeds)
# 20 rounds of one batch per job (the early phase of training: on 2 cores a job takes 1-2 minutes, so the 45
# method jobs and 10 grid jobs take about 1.5 hours, the 3 long jobs 20 minutes; raise federation.num_rounds on
# a bigger machine).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${1:-/tmp/collapipe-repro}"
shift || true
PARTS=("${@:-methods0 grid methods1 methods2 long}")
# Departures from the literal preset (results/README.md): network.uplink.energy_max_j=1000 (Table II's
# E_n^max = 10 J leaves no CU feasible with these encoders); runtime.backend=local (a cluster's K devices run in
# the CU's process: the modelled delays do not depend on the backend, and Ray actors cost start-up on 2 cores).
COMMON="federation=paper network=paper_table2 network.uplink.energy_max_j=1000 runtime.backend=local"
settings() {  # the rounds and evaluation of each task's runs
  case $1 in
    classification) echo "federation.num_rounds=20 eval.every=10 eval.max_examples=1000" ;;
    translation) echo "federation.num_rounds=20 eval.every=10 eval.max_examples=300" ;;
    ner) echo "federation.num_rounds=20 eval.every=10 eval.max_examples=500" ;;
  esac
}
sweep() { python -m collapipe_flwr.experiments -m "$@"; }
for part in ${PARTS[@]}; do
  case $part in
    methods[0-9]*)
      seed=${part#methods}
      for task in translation classification ner; do
        sweep task=$task $COMMON $(settings $task) seed=$seed \
          method=collapipe,collapipe_no_ss,vanilla_fl,titanic,pipeline hydra.sweep.dir="$ROOT/$task/methods/seed$seed"
      done
      ;;
    grid)
      for task in translation ner; do
        GRID="$COMMON federation.num_rounds=20 eval.every=20 $(settings $task | sed 's/.*eval.max_examples/eval.max_examples/') seed=0 method=collapipe_no_ss"
        sweep task=$task $GRID network.devices_per_cluster=1,3 method.fixed_m=1,4 hydra.sweep.dir="$ROOT/$task/grid/corners"
        sweep task=$task $GRID network.devices_per_cluster=2 method.fixed_m=2 hydra.sweep.dir="$ROOT/$task/grid/s2m2"
      done
      ;;
    long)
      sweep task=classification $COMMON federation.num_rounds=150 eval.every=50 eval.max_examples=1000 seed=0 \
        method=collapipe,titanic,pipeline hydra.sweep.dir="$ROOT/classification/long"
      ;;
    *) echo "unknown part $part (methodsSEED | grid | long)" >&2; exit 2 ;;
  esac
done
