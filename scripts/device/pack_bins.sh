#!/usr/bin/env bash
# Builds v4serve and test_cuda (and bench_kernels with V4_PACK_BENCH=1) with the CUDA backend on
# this developer machine (build-lead-cuda/, same CUDA 13.0 as the lent GPU machine) and packs them
# into .devdeps/bin.tar.xz for scripts/device/s28_run.sh, so a device call spends no time building.
# The binaries link the Debian libraries that .devdeps/deps.tar.xz carries (pack_deps.sh) and
# the toolkit's libcudart / libcublasLt (present on the device).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-lead-cuda
[ -f $B/CMakeCache.txt ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DV4_CUDA=ON \
  -DV4_TESTS=ON -DV4_BENCH=ON > /dev/null
t=(v4serve tests/test_cuda); [ "${V4_PACK_BENCH:-0}" = 1 ] && t+=(bench/bench_kernels)
ninja -C $B "${t[@]}"
mkdir -p .devdeps
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests bench || echo +dirty) built $(date -u '+%Y-%m-%d %H:%M UTC')" > $B/BUILT
files=(BUILT v4serve tests/test_cuda); [ "${V4_PACK_BENCH:-0}" = 1 ] && files+=(bench/bench_kernels)
tar cf - -C $B "${files[@]}" | xz -T2 -6 > .devdeps/bin.tar.xz
ls -la .devdeps/bin.tar.xz
