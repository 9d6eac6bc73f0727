#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, branches attnb2 / attn6): attention_dec variants 5 / 6
# (batch-1 fixed cost, per-tile latency, per-tile instruction count), in one call.
#   1. build v4serve + test_cuda + bench_kernels, run the CudaAttentionDec.* tests
#      (-> cuda-op-tests.log; Variant5* / Variant6* / SplitModel5 / BackendBf16 modes 5 / 6)
#   2. bench_kernels --only-attention -> cuda-attention.md (v2 / v1 / mma / v3 / v4 / v5 / v6
#      columns, v5 / v6 batch-1 split sweeps in attention.log, fixed-cost probes below the table)
#   3. v4serve bench, batch 1 at 4K and 900K, bf16 KV pools, --profile, one run per entry of
#      V4_B1_ATTN (default "auto lean": auto = v4 for short key lists, v5 for HCA at 900K; lean =
#      auto with V4_ATTN_DEC_LEAN=1, v6 instead of v5; a number N = V4_ATTN_DEC=N for every call)
#      -> bench-v4flash-20l-attn-b1.md (one section per entry)
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/attn_b1.sh", carry=[".devdeps"], timeout_s=600)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-local}; mkdir -p "$OUT"
V4_TARGETS="v4serve test_cuda bench_kernels" V4_SKIP_BENCH=1 \
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaAttentionDec.*}" bash scripts/device/run_gpu.sh > /dev/null 2>&1
echo "build+tests rc=$?"; grep -E "^\[  (FAILED|PASSED)|largest resident cluster" "$OUT/cuda-op-tests.log" | head -20
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L:$L/openblas-pthread PATH=/usr/local/cuda/bin:$PATH
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
timeout "${V4_KB_TIMEOUT:-240}" build-gpu/bench/bench_kernels --out "$OUT" --only-attention > "$OUT/attention.log" 2>&1
echo "attention bench rc=$?"; grep -E "^\| bf16 \| (CSA|HCA) \| 1 " "$OUT/cuda-attention.md"
common=(--model models/configs/v4-flash --load-format dummy --num-layers 20 --device cuda
        --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16)
: > "$OUT/bench-v4flash-20l-attn-b1.md"
for av in ${V4_B1_ATTN:-auto lean}; do
  dec=$av lean=0
  if [ "$av" = lean ]; then dec=auto lean=1; fi
  V4_ATTN_DEC=$dec V4_ATTN_DEC_LEAN=$lean timeout 150 build-gpu/v4serve bench "${common[@]}" --batch 1 \
    --context "${V4_B1_CONTEXT:-4K,900K}" --steps 10 --prefill-steps 1 --prefill-warmup 0 --profile \
    --out "$OUT/b1-$av.md" > "$OUT/bench-b1-$av.log" 2>&1
  echo "bench V4_ATTN_DEC=$dec V4_ATTN_DEC_LEAN=$lean rc=$?"; grep -E "^\| decode" "$OUT/b1-$av.md"
  { echo "## V4_ATTN_DEC=$dec V4_ATTN_DEC_LEAN=$lean"; echo; cat "$OUT/b1-$av.md"; echo; } >> "$OUT/bench-v4flash-20l-attn-b1.md"
  rm -f "$OUT/b1-$av.md"
done
cd "$OUT" && tar czf /tmp/v4-logs.tgz --exclude='*.md' --exclude='*.txt' . && mv /tmp/v4-logs.tgz logs.tgz &&
  find . -maxdepth 1 -type f ! -name '*.md' ! -name '*.txt' ! -name logs.tgz -delete
ls "$OUT"
