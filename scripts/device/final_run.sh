#!/usr/bin/env bash
# One device call for the session's closing measurements (each part also runs alone):
#   1. gpu_serve_check.sh: build, golden/graph/sampling GPU tests, GPU (fp32 mode) tokens == CPU
#      tokens through generate and HTTP serve;
#   2. bench_v4flash.sh (no rebuild): v4serve bench on the V4-Flash-shaped dummy model;
#   3. serve_v4flash.sh (no rebuild): serving sweep on the same model shape + GPU idle counters.
# Env knobs are those of the three scripts.
cd "$(dirname "$0")/../.."
export V4_GTEST_FILTER=${V4_GTEST_FILTER:-"CudaGolden*:CudaGraphs*:CudaSampling*"}
bash scripts/device/gpu_serve_check.sh; echo "gpu_serve_check rc=$?"
V4_SKIP_BUILD=1 bash scripts/device/bench_v4flash.sh > "${OUT:-out-local}/bench-run.log" 2>&1; echo "bench rc=$?"
V4_SKIP_BUILD=1 bash scripts/device/serve_v4flash.sh; echo "serve rc=$?"
