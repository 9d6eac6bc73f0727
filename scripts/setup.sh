#!/usr/bin/env bash
# Installs v4serve's build and test dependencies (Debian packages + PyPI) on a fresh machine.
set -euo pipefail
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs="build-essential cmake ninja-build pkg-config nlohmann-json3-dev libboost-dev libpcre2-dev
      libopenblas-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
      libbenchmark-dev python3 python3-pip curl"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# Python: the oracle-free test helpers (HF tokenizers for tokenizer parity, the official openai
# client for end-to-end tests). torch/transformers are only needed to regenerate fixtures.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/../tools/requirements-test.txt" \
  || python3 -m pip install -q --break-system-packages -r "$(dirname "$0")/../tools/requirements-test.txt"
