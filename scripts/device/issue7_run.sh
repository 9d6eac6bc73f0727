#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, multi-stream attention branches; one call): builds
# v4serve + test_cuda + bench_kernels, runs the multi-stream GPU tests first (CudaMultiStream.*:
# on vs off bit-identical, fp32/bf16, eager/graphs), then the graph and golden tests, then
# `v4serve bench --multi-stream off,on` on the V4-Flash-shaped dummy model (20 layers, bf16):
# decode at batch $V4_BATCH (default 1,64) × context $V4_CONTEXT (default 4K), every cell once
# with multi-stream off and once on (path column), without --profile (the region profile runs
# branches serially). A second, profiled run with multi-stream off gives the per-region split.
# Results under $OUT (≤ 8 files): device.log, build.log, cuda-op-tests.log,
# bench-v4flash-20l-mstream.md, bench-v4flash-20l-mstream-profile.md, logs.tgz.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/issue7_run.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
V4_TARGETS="v4serve test_cuda bench_kernels" V4_SKIP_BENCH=1 \
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaMultiStream.*:CudaGraphs.*:CudaGolden*}" \
  bash scripts/device/run_gpu.sh
echo "build+tests rc=$?"
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
unset V4_MULTI_STREAM
common=(--model models/configs/v4-flash --load-format dummy --num-layers "${V4_LAYERS:-20}"
        --device cuda --precision bf16 --mem-fraction 0.9 --batch "${V4_BATCH:-1,64}"
        --context "${V4_CONTEXT:-4K}" --steps "${V4_STEPS:-20}" --prefill-steps 2)
timeout 300 build-gpu/v4serve bench "${common[@]}" --multi-stream off,on \
  --out "$OUT/bench-v4flash-20l-mstream.md" > "$OUT/bench.log" 2>&1
echo "bench (multi-stream off,on) rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-mstream.md"
timeout 200 build-gpu/v4serve bench "${common[@]}" --profile \
  --out "$OUT/bench-v4flash-20l-mstream-profile.md" > "$OUT/bench-profile.log" 2>&1
echo "bench (profile) rc=$?"
cd "$OUT" && tar czf logs.tgz bench.log bench-profile.log && rm -f bench.log bench-profile.log
