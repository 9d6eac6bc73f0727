#!/usr/bin/env bash
# Sets up, builds and runs every CPU test: unit, golden, invariance, component and end-to-end
# (release build), then the unit and golden tests again under ASan + UBSan, then a compile-only
# CUDA build when nvcc is present. Usage: bash scripts/test.sh [--no-setup]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--no-setup" ] || bash scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 1200)

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DV4_SANITIZE=ON -DV4_BENCH=OFF
cmake --build build-asan -j "$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$jobs" -LE "e2e|slow" --timeout 1800)

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DV4_CUDA=ON
  # The CUDA backend, the binary that links it, the GPU op/golden tests and the kernel benchmarks.
  cmake --build build-cuda -j "$jobs" --target v4serve test_cuda bench_kernels
  echo "CUDA build compiled (not run: no GPU here; scripts/device/run_gpu.sh runs it on the H200)"
fi
echo "ALL TESTS PASSED"
