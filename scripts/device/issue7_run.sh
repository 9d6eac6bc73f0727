#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, one call): builds v4serve + test_cuda + bench_kernels,
# runs every GPU test, the FlashCompressor and native-weight GEMV / MoE kernel tables, then
# `v4serve bench --profile` on the V4-Flash-shaped dummy model (20 layers, bf16): decode at batch
# $V4_BATCH × context $V4_CONTEXT next to the byte floor, with the per-region split of each
# decode cell, and prefill per context. Results under $OUT (≤ 8 files): device.log, build.log,
# cuda-op-tests.log, cuda-compressor.md, cuda-wformat.md, bench-v4flash-20l-after.md, logs.tgz.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/issue7_run.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
V4_TARGETS="v4serve test_cuda bench_kernels" V4_SKIP_BENCH=1 \
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-*}" bash scripts/device/run_gpu.sh
echo "build+tests rc=$?"
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
timeout 120 build-gpu/bench/bench_kernels --out "$OUT" --only-compressor > "$OUT/compressor.log" 2>&1
echo "compressor bench rc=$?"
timeout 120 build-gpu/bench/bench_kernels --out "$OUT" --only-wformat > "$OUT/wformat.log" 2>&1
echo "wformat bench rc=$?"; grep -E "^(gemv|moe)" "$OUT/wformat.log"
timeout 300 build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
  --num-layers "${V4_LAYERS:-20}" --device cuda --precision bf16 --mem-fraction 0.9 \
  --batch "${V4_BATCH:-1,64}" --context "${V4_CONTEXT:-4K,128K,900K,1M}" --steps 5 --profile \
  --out "$OUT/bench-v4flash-20l-after.md" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-after.md"
cd "$OUT" && tar czf logs.tgz compressor.log wformat.log bench.log && rm -f compressor.log wformat.log bench.log
