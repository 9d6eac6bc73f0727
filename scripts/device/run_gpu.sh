#!/usr/bin/env bash
# Runs ON the lent GPU machine (device tool): unpacks the carried build dependencies
# (.devdeps/deps.tar.xz from scripts/device/pack_deps.sh) under /opt/v4deps, configures with
# -DV4_CUDA=ON, builds the CUDA tests and kernel benchmarks with all cores, records the GPU,
# driver and CUDA versions, runs the GPU op tests and the benchmarks, and copies logs and result
# tables into $OUT (at most 8 files come back, so everything is bundled into few files).
#
# From the developer machine:
#   bash scripts/device/pack_deps.sh      # once per session
#   git rev-parse --short HEAD > .devdeps/commit   # before each run (the device has no .git)
#   run(command="bash scripts/device/run_gpu.sh", carry=[".devdeps"], timeout_s=540)
# Options (env): V4_TARGETS (default "test_cuda bench_kernels"), V4_GTEST_FILTER (default "*"),
#   V4_SKIP_BENCH=1, V4_BENCH_ARGS (passed to bench_kernels), V4_TEST_SHARDS (run the tests as
#   that many gtest shards in parallel; default 1), V4_BUILD_DIR (default build-gpu),
#   V4_CUDA_FLAGS_EXTRA (appended to CMAKE_CUDA_FLAGS, e.g. -lineinfo for ncu source views),
#   V4_SKIP_TESTS=1 (build only, no test_cuda run), V4_BUILD_JOBS (compile jobs; default nproc).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH"
log=$OUT/device.log
exec > >(tee -a "$log") 2>&1
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }

step "machine"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
nvcc --version | tail -2
cmake --version | head -1
g++ --version | head -1
grep PRETTY /etc/os-release || true
V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown) + uncommitted working tree"
export V4_COMMIT V4_DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
echo "commit: $V4_COMMIT; driver: $V4_DRIVER"

step "unpack deps"
D=/opt/v4deps
if [ ! -d $D/usr ]; then
  mkdir -p $D
  if [ ! -f .devdeps/deps.tar.xz ]; then echo "missing .devdeps/deps.tar.xz (carry .devdeps)"; exit 2; fi
  python3 - <<EOF
import tarfile
with tarfile.open(".devdeps/deps.tar.xz") as t:
    t.extractall("$D", filter="tar")
EOF
fi
L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_LIBDIR="$L/pkgconfig:$D/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR=$D
export CMAKE_PREFIX_PATH=$D/usr

step "configure"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
B=${V4_BUILD_DIR:-build-gpu}
cmake -S . -B $B $gen -DCMAKE_BUILD_TYPE=Release -DV4_CUDA=ON -DV4_TESTS=ON -DV4_BENCH=ON \
  -DPKG_CONFIG_EXECUTABLE=$D/usr/bin/pkgconf \
  -DCMAKE_INCLUDE_PATH="$D/usr/include;$D/usr/include/x86_64-linux-gnu" \
  -DCMAKE_LIBRARY_PATH="$L;$L/openblas-pthread" \
  -DBoost_INCLUDE_DIR=$D/usr/include \
  -DCMAKE_CXX_FLAGS="-isystem $D/usr/include" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA_FLAGS="-isystem $D/usr/include ${V4_CUDA_FLAGS_EXTRA:-}" >"$OUT/build.log" 2>&1
rc=$?
tail -3 "$OUT/build.log"
if [ $rc -ne 0 ]; then step "configure FAILED"; tail -60 "$OUT/build.log"; exit 3; fi

step "build ${V4_TARGETS:-test_cuda bench_kernels}"
cmake --build $B -j "${V4_BUILD_JOBS:-$(nproc)}" --target ${V4_TARGETS:-test_cuda bench_kernels} >>"$OUT/build.log" 2>&1
rc=$?
grep -E "error|warning: " "$OUT/build.log" | head -40
if [ $rc -ne 0 ]; then step "build FAILED"; tail -80 "$OUT/build.log"; exit 4; fi

step "GPU op tests"
if [ "${V4_SKIP_TESTS:-0}" = 1 ]; then
  echo "skipped (V4_SKIP_TESTS=1)"; test_rc=0
elif [ -x $B/tests/test_cuda ] && [ "${V4_TEST_SHARDS:-1}" -gt 1 ]; then
  # gtest shards in parallel on the one GPU (the host-side references dominate the suite's time);
  # the logs are concatenated in shard order, the exit code is the worst shard's.
  n=${V4_TEST_SHARDS}; pids=()
  for i in $(seq 0 $((n - 1))); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i V4_REQUIRE_GPU=1 $B/tests/test_cuda \
      --gtest_filter="${V4_GTEST_FILTER:-*}" --gtest_color=no > "$OUT/cuda-op-tests.$i.log" 2>&1 &
    pids+=($!)
  done
  test_rc=0
  for p in "${pids[@]}"; do wait "$p" || test_rc=1; done
  for i in $(seq 0 $((n - 1))); do echo "=== shard $i of $n"; cat "$OUT/cuda-op-tests.$i.log"; done \
    > "$OUT/cuda-op-tests.log"
  rm -f "$OUT"/cuda-op-tests.*.log
  grep -E "^\[  (PASSED|FAILED)" "$OUT/cuda-op-tests.log"
  echo "test_cuda exit code: $test_rc ($n shards)"
elif [ -x $B/tests/test_cuda ]; then
  V4_REQUIRE_GPU=1 $B/tests/test_cuda --gtest_filter="${V4_GTEST_FILTER:-*}" --gtest_color=no 2>&1 | tee "$OUT/cuda-op-tests.log"
  test_rc=${PIPESTATUS[0]}
  echo "test_cuda exit code: $test_rc"
else
  echo "no test_cuda binary"; test_rc=5
fi

if [ "${V4_SKIP_BENCH:-0}" != 1 ] && [ -x $B/bench/bench_kernels ]; then
  step "kernel benchmarks"
  $B/bench/bench_kernels --out "$OUT" ${V4_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  step "ncu: Lightning TopK 262,144 -> 512, batch 1 (default and v3 cluster 8)"
  if command -v ncu >/dev/null; then
    for v in 0 16; do
      echo "## variant $v" >>"$OUT/ncu-topk.txt"
      timeout 100 ncu --kernel-name regex:topk_kernel --launch-skip 10 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        $B/bench/bench_kernels --profile-topk $v >>"$OUT/ncu-topk.txt" 2>&1
    done
    grep -E "## variant|Duration|Elapsed Cycles" "$OUT/ncu-topk.txt" | head -20
  fi
  step "torch.topk baseline"
  python3 scripts/device/torch_topk_baseline.py "$OUT/torch-topk.md" 2>&1 | tail -3
fi
step "done (tests rc=$test_rc)"
exit $test_rc
