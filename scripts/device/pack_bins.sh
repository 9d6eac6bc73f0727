#!/usr/bin/env bash
# Builds v4serve and test_cuda (and bench_kernels with V4_PACK_BENCH=1) with the CUDA backend on
# this developer machine (build-lead-cuda/, same CUDA 13.0 as the lent GPU machine) and packs them,
# stripped, with the Debian runtime libraries they link (OpenBLAS, gfortran, quadmath, spdlog,
# fmt, PCRE2; libcudart / libcublasLt are the device's own) into .devdeps-bin/bin.tar.xz for
# scripts/device/s28_run.sh, so a device call spends no time building. Carry only .devdeps-bin
# (the working tree + this must stay under the 64 MiB a call carries).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-lead-cuda
[ -f $B/CMakeCache.txt ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DV4_CUDA=ON \
  -DV4_TESTS=ON -DV4_BENCH=ON > /dev/null
t=(v4serve tests/test_cuda); [ "${V4_PACK_BENCH:-0}" = 1 ] && t+=(bench/bench_kernels)
ninja -C $B "${t[@]}"
P=$(mktemp -d); mkdir -p "$P/tests" "$P/bench" "$P/lib"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests bench CMakeLists.txt || echo +dirty) built $(date -u '+%Y-%m-%d %H:%M UTC')" > "$P/BUILT"
for f in "${t[@]}"; do cp "$B/$f" "$P/$f" && strip "$P/$f"; done
for l in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libspdlog.so.1.10 libfmt.so.9 libpcre2-8.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$P/lib/$l"
done
mkdir -p .devdeps-bin
tar cf - -C "$P" . | xz -T2 -9 > .devdeps-bin/bin.tar.xz
git rev-parse --short HEAD > .devdeps-bin/commit
rm -rf "$P"
ls -la .devdeps-bin/bin.tar.xz
