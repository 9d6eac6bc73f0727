#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 6 "must show"): builds v4serve + the GPU tests (run_gpu.sh,
# filter CudaFill.*:CudaDummy.* by default), then `v4serve bench` on a V4-Flash-shaped dummy model
# (models/configs/v4-flash, --load-format dummy, layers cut to $V4_LAYERS so it fits one H200):
# decode step time at batch $V4_BATCH and prefill tokens/s at context $V4_CONTEXT, each with its
# byte / FLOP floor, written to $OUT/bench-v4flash-${V4_LAYERS}l.md (docs/bench.md).
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/bench_v4flash.sh", carry=[".devdeps"], timeout_s=600)
# Options (env): V4_LAYERS (20), V4_BATCH (1,16,64,256), V4_CONTEXT (4K,128K,1M),
#   V4_PRECISION (bf16), V4_MEM_FRACTION (0.9), V4_STEPS (10), V4_BENCH_EXTRA (more flags),
#   V4_SKIP_BUILD=1, V4_OUT_NAME (report file name, default bench-v4flash-${V4_LAYERS}l.md).
# Per-region decode profile: V4_BENCH_EXTRA=--profile V4_OUT_NAME=profile-v4flash-20l.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
LAYERS=${V4_LAYERS:-20}
if [ "${V4_SKIP_BUILD:-0}" != 1 ]; then
  V4_TARGETS="v4serve test_cuda" V4_SKIP_BENCH=1 V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaFill.*:CudaDummy.*}" \
    bash scripts/device/run_gpu.sh
  echo "build+tests rc=$?"
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
BIN=build-gpu/v4serve
[ -x $BIN ] || { echo "no v4serve binary"; exit 4; }
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
$BIN info --model models/configs/v4-flash --load-format dummy --num-layers "$LAYERS" >"$OUT/info-v4flash.txt" 2>&1
$BIN bench --model models/configs/v4-flash --load-format dummy --num-layers "$LAYERS" --device cuda \
  --precision "${V4_PRECISION:-bf16}" --mem-fraction "${V4_MEM_FRACTION:-0.9}" \
  --batch "${V4_BATCH:-1,16,64,256}" --context "${V4_CONTEXT:-4K,128K,1M}" --steps "${V4_STEPS:-10}" \
  --out "$OUT/${V4_OUT_NAME:-bench-v4flash-${LAYERS}l.md}" ${V4_BENCH_EXTRA:-} 2>&1 | tee "$OUT/bench-v4flash.log"
echo "bench rc=${PIPESTATUS[0]}"
