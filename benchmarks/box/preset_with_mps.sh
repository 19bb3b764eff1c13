#!/bin/bash
# preset_with_mps.sh: the Pong GPU preset with and without CUDA's multi-process service (MPS), interleaved, on a GPU
# box: A (no MPS) and M (an MPS daemon up for the run, its pipes in /tmp/mps), each `preset_variants` over 20 s; the
# runners' CUDA contexts (num_gpus_per_env_runner) then share the GPU instead of taking turns on it. Run from an
# rl_speed checkout with the box's wheels installed (benchmarks/box/setup.sh); each run's log goes to OUT
# (default /tmp/mps_runs) and its table row to stdout. Results: results/preset-variants/2026-12-07-pong-h100-mps.md.
set -u
OUT=${OUT:-/tmp/mps_runs}; mkdir -p "$OUT"
source benchmarks/box/setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/envs
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/box.txt
nproc >> $OUT/box.txt; lscpu | grep "Model name" >> $OUT/box.txt
V='python3 -m benchmarks.race.preset_variants tuned_examples/atari_ppo_gpu.yaml --experiment pong-fastppo-gpu'
V="$V --num-gpus 1 --seconds 20"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
for run in A1 M1 A2 M2; do
  echo "== $run $(date +%T)"
  case $run in M*) nvidia-cuda-mps-control -d && echo "mps daemon up";; esac
  timeout 110 $V --variant ${run:0:1} '{}' --order ${run:0:1} > $OUT/$run.log 2>&1
  echo "rc=$?"; grep -A3 "^| variant" $OUT/$run.log | sed -n 3p
  case $run in M*) echo quit | nvidia-cuda-mps-control; sleep 2;; esac
done
echo "== done $(date +%T)"
