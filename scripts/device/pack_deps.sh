#!/usr/bin/env bash
# Packs the Debian build dependencies of v4serve (headers, libraries, CMake/pkg-config files of
# the packages below, plus pkgconf) into .devdeps/deps.tar.xz so that the lent GPU machine, which
# has only the CUDA toolkit, can configure and build the whole project. Run HERE (not on the
# device), once per session; .devdeps/ is ignored through .git/info/exclude and travels with
# `carry: [".devdeps"]`. scripts/device/run_gpu.sh unpacks it under /opt/v4deps (never into /).
# The device is Ubuntu 24.04 (glibc 2.39); these are Debian 12 (glibc 2.36) builds, which run
# there. Usage: bash scripts/device/pack_deps.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs=(libboost1.74-dev nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libspdlog-dev
      libspdlog1.10 libpcre2-dev libpcre2-8-0 libopenblas-dev libopenblas-pthread-dev
      libopenblas0-pthread libgfortran5 libquadmath0 libgtest-dev libgmock-dev
      pkgconf-bin pkgconf libpkgconf3)
list=$(mktemp)
for p in "${pkgs[@]}"; do
  dpkg -L "$p" | while read -r f; do
    # Plain files and symlinks only; skip docs, man pages and the huge static OpenBLAS archive.
    if [ -f "$f" ] || [ -L "$f" ]; then
      case "$f" in
        /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*|*.a)
          case "$f" in *libgtest*.a|*libgmock*.a) echo "${f#/}" ;; esac ;;
        *) echo "${f#/}" ;;
      esac
    fi
  done
done | sort -u >"$list"
# Debian's alternatives links (libblas/libopenblas -> openblas-pthread) as real links in the tree.
alt=$(mktemp -d)
mkdir -p "$alt/usr/lib/x86_64-linux-gnu" "$alt/usr/include/x86_64-linux-gnu"
for n in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 libcblas.so libcblas.so.3; do
  src=/usr/lib/x86_64-linux-gnu/$n
  if [ -e "$src" ]; then ln -sf "openblas-pthread/$(basename "$(readlink -f "$src")")" \
    "$alt/usr/lib/x86_64-linux-gnu/$n"; fi
done
ln -sf openblas-pthread/cblas.h "$alt/usr/include/x86_64-linux-gnu/cblas.h"
mkdir -p .devdeps
tar -C / -cf .devdeps/deps.tar -T "$list"
tar -C "$alt" -rf .devdeps/deps.tar usr
xz -T2 -6 -f .devdeps/deps.tar
rm -rf "$list" "$alt"
ls -la .devdeps/
