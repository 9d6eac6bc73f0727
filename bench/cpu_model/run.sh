#!/bin/sh
# Reproduces bench/results/cpu-embedded.md: the embedded model and the largest fixture model,
# 512-token prompt, 64 decode steps at batch 1 and 8, best of 10, on 2 and 1 threads.
# Usage: bench/cpu_model/run.sh [BUILD_DIR]   (default build-integ)
set -e
cd "$(dirname "$0")/../.."
B=${1:-build-integ}
date -u; uptime; git rev-parse HEAD
grep -m1 "model name" /proc/cpuinfo; nproc
for m in models/default tests/fixtures/tiny-fp8-mxfp4; do
  for t in 2 1; do
    echo "== $m V4_NUM_THREADS=$t"
    V4_NUM_THREADS=$t "$B/bench/bench_cpu_model" --model "$m" --prompt-len 512 --decode 64 \
      --batch 1,8 --reps 10 2>&1 | grep -v '\[info\]'
  done
done
uptime
