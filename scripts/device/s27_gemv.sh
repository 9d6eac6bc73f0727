#!/usr/bin/env bash
# Runs ON the lent GPU machine (session 27, one call, < 10 minutes): gemv_stream's persistent grid.
#   1. builds v4serve, test_cuda and bench_kernels (run_gpu.sh; V4_SKIP_BUILD=1 on a warm machine
#      reuses build-gpu), runs the GPU op tests in $V4_GTEST_FILTER (default the GEMV / MoE / wformat
#      suites; "*" = all) -> $OUT/cuda-op-tests.log;
#   2. bench_kernels --only-gemv with the persistent grid (default) and with V4_GEMV_PERSIST=0 (one
#      block per tile) -> $OUT/cuda-gemv.md, $OUT/cuda-gemv-nopersist.md;
#   3. v4serve bench, V4-Flash shape, 20 layers, batch 1, 4K and 900K, bf16 KV + fp8 indexer keys
#      (as served), once per env entry of $V4_E2E_ENVS (default "default V4_GEMV_PERSIST=0
#      V4_MOE_GEMV_STREAM=1"; an entry sets comma-separated VAR=VALUE pairs; entries that would start
#      after $V4_BUDGET_S seconds, default 540, are skipped) -> $OUT/bench-e2e.md.
# Env: V4_BUILD_TARGETS (default "v4serve test_cuda bench_kernels"), V4_TEST_SHARDS (run_gpu.sh),
#   V4_GEMV_BENCH=0 (no bench_kernels stage).
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/s27_gemv.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT/logs"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s]"; }
export NCCL_NVLS_ENABLE=0 PATH="/usr/local/cuda/bin:$PATH"
FILTER=${V4_GTEST_FILTER:-"CudaGemvStream*:CudaWFormat*:CudaGolden*:CudaDummy*"}
if [ "${V4_SKIP_BUILD:-0}" != 1 ] || [ ! -x build-gpu/v4serve ]; then
  OUT=$OUT/logs V4_TARGETS="${V4_BUILD_TARGETS:-v4serve test_cuda bench_kernels}" V4_SKIP_BENCH=1 \
    V4_GTEST_FILTER="$FILTER" bash scripts/device/run_gpu.sh > /dev/null 2>&1
  echo "$(el) build+tests rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|build FAILED|error:" "$OUT/logs/device.log" | head -30
  cp "$OUT/logs/cuda-op-tests.log" "$OUT/cuda-op-tests.log" 2> /dev/null
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
if [ "${V4_SKIP_BUILD:-0}" = 1 ]; then
  V4_REQUIRE_GPU=1 build-gpu/tests/test_cuda --gtest_filter="$FILTER" --gtest_color=no > "$OUT/cuda-op-tests.log" 2>&1
  echo "$(el) test_cuda rc=$?"; grep -E "^\[  FAILED|^\[  PASSED" "$OUT/cuda-op-tests.log" | head -20
fi
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
if [ "${V4_GEMV_BENCH:-1}" = 1 ] && [ -x build-gpu/bench/bench_kernels ]; then
  mkdir -p "$OUT/logs/np"
  timeout 120 build-gpu/bench/bench_kernels --out "$OUT" --only-gemv > "$OUT/logs/gemv.log" 2>&1
  echo "$(el) gemv bench rc=$?"; grep -E "^gemv" "$OUT/logs/gemv.log" | head -30
  V4_GEMV_PERSIST=0 timeout 120 build-gpu/bench/bench_kernels --out "$OUT/logs/np" --only-gemv > "$OUT/logs/gemv-np.log" 2>&1
  echo "$(el) gemv bench (V4_GEMV_PERSIST=0) rc=$?"
  mv "$OUT/logs/np/cuda-gemv.md" "$OUT/cuda-gemv-nopersist.md" 2> /dev/null
fi
f="$OUT/bench-e2e.md"
: > "$f"
for entry in ${V4_E2E_ENVS:-default V4_GEMV_PERSIST=0 V4_MOE_GEMV_STREAM=1}; do
  if [ $(( $(date +%s) - T0 )) -gt "${V4_BUDGET_S:-540}" ]; then echo "skip e2e ($entry): budget"; continue; fi
  envs=()
  [ "$entry" != default ] && IFS=, read -r -a envs <<< "$entry"
  env "${envs[@]}" timeout 150 build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
    --num-layers 20 --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 \
    --index-cache-dtype fp8 --batch 1 --context 4K,900K --steps 20 --prefill-steps 1 --prefill-warmup 0 \
    --prefill-chunk 256 --out "$OUT/logs/e2e.md" > "$OUT/logs/e2e-$entry.log" 2>&1
  echo "$(el) e2e ($entry) rc=$?"; grep -E "^\| decode" "$OUT/logs/e2e.md"
  { echo "## env: $entry"; echo; cat "$OUT/logs/e2e.md"; echo; } >> "$f"
done
cd "$OUT" && tar czf /tmp/s27g-logs.tgz logs && rm -rf logs && mv /tmp/s27g-logs.tgz logs.tgz
ls -la "$OUT"
