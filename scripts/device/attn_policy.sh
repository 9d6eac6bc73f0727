#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, session 7): the data for the attention_dec variant policy
# and the TopK phase stamps, in one call.
#   1. build v4serve + test_cuda + bench_kernels, run the CudaAttentionDec.* tests
#   2. bench_kernels --only-attention -> cuda-attention.md (v1 / v2 / v3 / v4 columns, split sweep,
#      batch-1 fixed-cost probes)
#   3. v4serve bench, batch 64 at 4K and 128K, no profile, V4_ATTN_DEC = 2 / 3 / 4
#      -> bench-v4flash-20l-attn-b64.md (one table per variant)
#   4. TopK phase stamps (rebuild bench_kernels with -DV4_TOPK_PHASES=1) of $V4_PHASES
#      -> cuda-topk-phases-v6v7.txt
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/attn_policy.sh", carry=[".devdeps"], timeout_s=600)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out-local}; mkdir -p "$OUT"
V4_TARGETS="v4serve test_cuda bench_kernels" V4_SKIP_BENCH=1 \
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaAttentionDec.*}" bash scripts/device/run_gpu.sh > /dev/null 2>&1
echo "build+tests rc=$?"; grep -E "^\[  (FAILED|PASSED)" "$OUT/cuda-op-tests.log" | head
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L:$L/openblas-pthread PATH=/usr/local/cuda/bin:$PATH
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
timeout "${V4_KB_TIMEOUT:-240}" build-gpu/bench/bench_kernels --out "$OUT" --only-attention > "$OUT/attention.log" 2>&1
echo "attention bench rc=$?"
common=(--model models/configs/v4-flash --load-format dummy --num-layers 20 --device cuda
        --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16)
: > "$OUT/bench-v4flash-20l-attn-b64.md"
for av in ${V4_B64_ATTN:-2 3 4}; do
  V4_ATTN_DEC=$av timeout 150 build-gpu/v4serve bench "${common[@]}" --batch "${V4_B64_BATCH:-64}" \
    --context "${V4_B64_CONTEXT:-4K,128K}" --steps 10 --prefill-steps 1 --prefill-warmup 0 \
    --out "$OUT/b64-$av.md" > "$OUT/bench-b64-$av.log" 2>&1
  echo "bench V4_ATTN_DEC=$av rc=$?"; grep -E "^\| decode" "$OUT/b64-$av.md"
  { echo "## V4_ATTN_DEC=$av"; echo; cat "$OUT/b64-$av.md"; echo; } >> "$OUT/bench-v4flash-20l-attn-b64.md"
  rm -f "$OUT/b64-$av.md"
done
cmake build-gpu -DCMAKE_CUDA_FLAGS="-isystem $D/usr/include -DV4_TOPK_PHASES=1" > /dev/null 2>&1
cmake --build build-gpu -j "$(nproc)" --target bench_kernels > "$OUT/build-phases.log" 2>&1 || tail -20 "$OUT/build-phases.log"
for vn in ${V4_PHASES:-"37:262144 38:262144 40:262144 37:65536 37:8192"}; do
  timeout 60 build-gpu/bench/bench_kernels --phases-topk "${vn%%:*}" "${vn##*:}" 2>&1 | tail -1
done | tee "$OUT/cuda-topk-phases-v6v7.txt"
cmake build-gpu -DCMAKE_CUDA_FLAGS="-isystem $D/usr/include" > /dev/null 2>&1
cd "$OUT" && tar czf /tmp/v4-logs.tgz --exclude='*.md' --exclude='*.txt' . && mv /tmp/v4-logs.tgz logs.tgz &&
  find . -maxdepth 1 -type f ! -name '*.md' ! -name '*.txt' ! -name logs.tgz -delete
ls "$OUT"
