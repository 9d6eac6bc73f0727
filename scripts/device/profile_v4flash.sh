#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7): builds v4serve + test_cuda + bench_kernels, runs the GPU
# op tests named by $V4_GTEST_FILTER, the native-weight GEMV / MoE kernel rows
# (bench_kernels --only-wformat) for each V4_GEMV_BLOCKS_PER_SM in $V4_GEMV_SWEEP, then the
# per-region decode and prefill profile of the V4-Flash-shaped dummy model (v4serve bench
# --profile, batch $V4_BATCH at 4K context; the 4K cell's prefill step of 4096 tokens gets its own
# table) for each value again. Results under $OUT:
#   cuda-op-tests.log, device.log, cuda-wformat-bps<N>.md, profile-v4flash-20l-bps<N>.md,
#   cuda-topk.md (V4_TOPK=1, default), logs.tgz.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/profile_v4flash.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
V4_TARGETS="v4serve test_cuda bench_kernels" V4_SKIP_BENCH=1 \
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaOps.*:CudaWFormat.*:CudaGraphs.*}" bash scripts/device/run_gpu.sh
echo "build+tests rc=$?"
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
for bps in ${V4_GEMV_SWEEP:-4 16}; do
  V4_GEMV_BLOCKS_PER_SM=$bps timeout 200 build-gpu/bench/bench_kernels --out "$OUT" --only-wformat \
    > "$OUT/wformat-bps$bps.log" 2>&1
  mv "$OUT/cuda-wformat.md" "$OUT/cuda-wformat-bps$bps.md" 2>/dev/null
  grep -E "^(gemv|moe)" "$OUT/wformat-bps$bps.log" | sed "s/^/[bps=$bps] /"
done
if [ "${V4_TOPK:-1}" = 1 ]; then  # Lightning TopK table, every variant + CUB baseline
  timeout 240 build-gpu/bench/bench_kernels --out "$OUT" --only-topk > "$OUT/bench-topk.log" 2>&1
  echo "topk bench rc=$?"; grep -E "batch=1 " "$OUT/bench-topk.log" | sed 's/  */ /g' | head -60
fi
for bps in ${V4_PROFILE_SWEEP:-4 16}; do
  V4_GEMV_BLOCKS_PER_SM=$bps build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
    --num-layers "${V4_LAYERS:-20}" --device cuda --precision bf16 --mem-fraction 0.9 \
    --batch "${V4_BATCH:-1,64}" --context 4K --steps 5 --profile \
    --out "$OUT/profile-v4flash-20l-bps$bps.md" > "$OUT/profile-bps$bps.log" 2>&1
  echo "[bps=$bps] bench rc=$?"
  grep -E "^\| (decode|prefill)" "$OUT/profile-v4flash-20l-bps$bps.md" | sed "s/^/[bps=$bps] /"
done
cd "$OUT" && tar czf logs.tgz *.log && rm -f wformat-bps*.log profile-bps*.log
