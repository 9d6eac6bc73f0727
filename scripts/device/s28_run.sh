#!/usr/bin/env bash
# Runs ON the lent GPU machine (session 28, one call, < 10 minutes), without a build there when
# the binaries come prebuilt:
#   0. .devdeps-bin/bin.tar.xz (scripts/device/pack_bins.sh: v4serve, test_cuda[, bench_kernels]
#      built on the developer machine with -DV4_CUDA=ON, same CUDA 13.0, + their Debian runtime
#      libraries) is unpacked into build-gpu/; without it run_gpu.sh builds them here from
#      .devdeps/deps.tar.xz (~5–7 minutes);
#   1. the GPU op tests in $V4_GTEST_FILTER (default "*"), $V4_TEST_SHARDS (default 8) gtest
#      shards in parallel -> $OUT/cuda-op-tests.log (V4_TESTS=0: none);
#   2. v4serve bench, V4-Flash shape, $V4_E2E_LAYERS (default 20) layers, batch 1, 4K and 900K,
#      bf16 KV + fp8 indexer keys (as served), once per entry of $V4_E2E_ENVS (default "default";
#      an entry sets comma-separated VAR=VALUE pairs), each entry $V4_E2E_REPS (default 2) times
#      in alternation -> $OUT/bench-e2e.md; entries that would start after $V4_BUDGET_S
#      (default 520) seconds are skipped;
#   1b. V4_TEST2_FILTER / V4_TEST2_ENV (optional): a second test run under other settings ->
#      $OUT/cuda-op-tests-2.log;
#   3. V4_NCU_KERNELS="regex ..." (optional): ncu --set full of those kernels in one decode step
#      at 900K (4 layers: SWA, SWA, CSA, HCA) -> $OUT/ncu-<n>.txt (details page); "regex@k" skips the
#      first k matching launches.
# From the developer machine:
#   bash scripts/device/pack_bins.sh      # writes .devdeps-bin/{bin.tar.xz,commit}
#   run(command="bash scripts/device/s28_run.sh", carry=[".devdeps-bin"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT/logs"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s]"; }
export NCCL_NVLS_ENABLE=0 PATH="/usr/local/cuda/bin:$PATH"
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
if [ -f .devdeps-bin/bin.tar.xz ]; then
  COMMIT=$(cat .devdeps-bin/commit 2>/dev/null || echo unknown)
  mkdir -p build-gpu && tar xJf .devdeps-bin/bin.tar.xz -C build-gpu || { echo "bin unpack failed"; exit 2; }
  L=$root/build-gpu/lib
  echo "$(el) prebuilt binaries: $(cat build-gpu/BUILT 2>/dev/null)"
else
  COMMIT=$(cat .devdeps/commit 2>/dev/null || echo unknown)
  OUT=$OUT/logs V4_TARGETS="${V4_BUILD_TARGETS:-v4serve test_cuda}" V4_SKIP_BENCH=1 V4_SKIP_TESTS=1 \
    bash scripts/device/run_gpu.sh > /dev/null 2>&1
  echo "$(el) build rc=$?"; grep -E "build FAILED|error:" "$OUT/logs/device.log" | head -30
fi
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
[ -x build-gpu/v4serve ] || { echo "no build-gpu/v4serve"; exit 3; }
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "GPU: $GPU; commit $COMMIT"

if [ "${V4_TESTS:-1}" = 1 ] && [ -x build-gpu/tests/test_cuda ]; then
  n=${V4_TEST_SHARDS:-8}; pids=()
  for i in $(seq 0 $((n - 1))); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i V4_REQUIRE_GPU=1 timeout 400 build-gpu/tests/test_cuda \
      --gtest_filter="${V4_GTEST_FILTER:-*}" --gtest_color=no > "$OUT/logs/t.$i.log" 2>&1 &
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  { echo "# test_cuda on $GPU, commit $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC'), filter ${V4_GTEST_FILTER:-*}, $n shards"
    for i in $(seq 0 $((n - 1))); do echo "=== shard $i of $n"; cat "$OUT/logs/t.$i.log"; done; } > "$OUT/cuda-op-tests.log"
  echo "$(el) test_cuda rc=$rc"; grep -E "^\[  (PASSED|FAILED)" "$OUT/cuda-op-tests.log" | head -30
  grep -E "^\[  PASSED" "$OUT/cuda-op-tests.log" | awk '{s+=$4} END {print "passed total:", s}'
fi

if [ -n "${V4_TEST2_FILTER:-}" ] && [ -x build-gpu/tests/test_cuda ]; then
  # A second test run under other settings (V4_TEST2_ENV="VAR=VALUE ..."), e.g. an A/B form.
  env ${V4_TEST2_ENV:-} V4_REQUIRE_GPU=1 timeout 300 build-gpu/tests/test_cuda --gtest_filter="$V4_TEST2_FILTER" \
    --gtest_color=no > "$OUT/cuda-op-tests-2.log" 2>&1
  echo "$(el) test_cuda ($V4_TEST2_ENV: $V4_TEST2_FILTER) rc=$?"; grep -E "^\[  (PASSED|FAILED)" "$OUT/cuda-op-tests-2.log"
  sed -i "1i # test_cuda on $GPU, commit $COMMIT, env $V4_TEST2_ENV, filter $V4_TEST2_FILTER" "$OUT/cuda-op-tests-2.log"
fi

f="$OUT/bench-e2e.md"
{ echo "# e2e decode A/B: V4-Flash shape, ${V4_E2E_LAYERS:-20} layers, batch 1, 4K and 900K"; echo
  echo "- commit: $COMMIT, date: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU: $GPU; script: scripts/device/s28_run.sh"
  echo "- command: \`[ENV] build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy --num-layers ${V4_E2E_LAYERS:-20} --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 --index-cache-dtype fp8 --batch 1 --context 4K,900K --steps 20 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 256\`"
  echo; } > "$f"
for rep in $(seq 1 "${V4_E2E_REPS:-2}"); do
  for entry in ${V4_E2E_ENVS:-default}; do
    if [ $(( $(date +%s) - T0 )) -gt "${V4_BUDGET_S:-520}" ]; then echo "skip e2e ($entry): budget"; continue; fi
    envs=()
    [ "$entry" != default ] && IFS=, read -r -a envs <<< "$entry"
    rm -f "$OUT/logs/e2e.md"
    env "${envs[@]}" timeout 150 build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
      --num-layers "${V4_E2E_LAYERS:-20}" --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 \
      --index-cache-dtype fp8 --batch 1 --context 4K,900K --steps 20 --prefill-steps 1 --prefill-warmup 0 \
      --prefill-chunk 256 --out "$OUT/logs/e2e.md" > "$OUT/logs/e2e-$rep.log" 2>&1
    rc=$?; echo "$(el) e2e ($entry, rep $rep) rc=$rc"
    [ -f "$OUT/logs/e2e.md" ] || { tail -3 "$OUT/logs/e2e-$rep.log"; continue; }
    grep -E "^\| decode" "$OUT/logs/e2e.md"
    { echo "## env: $entry (rep $rep)"; echo; cat "$OUT/logs/e2e.md"; echo; } >> "$f"
  done
done

k=0
for kr in ${V4_NCU_KERNELS:-}; do
  [ $(( $(date +%s) - T0 )) -gt "${V4_BUDGET_S:-520}" ] && { echo "skip ncu $kr: budget"; continue; }
  k=$((k + 1)); skip=0
  case "$kr" in *@*) skip=${kr##*@}; kr=${kr%@*};; esac
  V4_BENCH_PROFILER=decode timeout 120 ncu --profile-from-start off --clock-control none --set full \
    --kernel-name "regex:$kr" --launch-skip "$skip" --launch-count 1 \
    build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy --num-layers 4 \
    --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 --index-cache-dtype fp8 \
    --batch 1 --context 900K --steps 1 --warmup 2 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 256 \
    --out "$OUT/logs/ncu-bench-$k.md" > "$OUT/ncu-$k.txt" 2>&1
  echo "$(el) ncu $kr rc=$?"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy" "$OUT/ncu-$k.txt" | head -8
done
cd "$OUT" && tar czf /tmp/s28-logs.tgz logs && rm -rf logs && mv /tmp/s28-logs.tgz logs.tgz
ls -la "$OUT"
