#!/usr/bin/env bash
# Runs ON the lent GPU machine: the Lightning TopK exactness tests, the TopK table for every
# variant (bench_kernels --only-topk, batch 1 and 64, 8K..256K, warm/cold, CUB baseline), then a
# rebuild with -DV4_TOPK_PHASES=1 and the per-phase SM-cycle stamps of selected variants.
#   bash scripts/device/pack_deps.sh; git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/topk_variants.sh", carry=[".devdeps"], timeout_s=600)
# Files back in $OUT: device.log, build.log, cuda-op-tests.log, cuda-topk.md, bench-topk.log,
# phases.txt. Env: V4_PHASES (variant/n pairs, default below).
set -u
cd "$(dirname "$0")/../.."
V4_GTEST_FILTER='*Topk*' V4_SKIP_BENCH=1 bash scripts/device/run_gpu.sh > /dev/null 2>&1
tail -4 "$OUT/device.log"
grep -E "^\[  FAILED|Failure|Expected|Which is|unsupported" "$OUT/cuda-op-tests.log" | sort | uniq -c | head -30
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$L:$L/openblas-pthread PATH=/usr/local/cuda/bin:$PATH
timeout 300 build-gpu/bench/bench_kernels --out "$OUT" --only-topk > "$OUT/bench-topk.log" 2>&1
grep -E "batch=1 " "$OUT/bench-topk.log" | sed 's/  */ /g'
cmake build-gpu -DCMAKE_CUDA_FLAGS="-isystem $D/usr/include -DV4_TOPK_PHASES=1" > /dev/null 2>&1
cmake --build build-gpu -j "$(nproc)" --target bench_kernels > "$OUT/build-phases.log" 2>&1 || tail -20 "$OUT/build-phases.log"
for vn in ${V4_PHASES:-"46:262144 37:262144 47:262144 46:131072 46:65536 37:65536 46:8192 37:8192"}; do
  build-gpu/bench/bench_kernels --phases-topk "${vn%%:*}" "${vn##*:}" 2>&1 | tail -1
done | tee "$OUT/phases.txt"
# leave build-gpu as run_gpu.sh configures it
cmake build-gpu -DCMAKE_CUDA_FLAGS="-isystem $D/usr/include" > /dev/null 2>&1
