#!/usr/bin/env bash
# Developer machine: writes the source of commit(s) as untracked archives old-<sha>.tar.xz of this
# checkout (no .git, no weights, no test fixtures or results: ~0.7 MB each, 4.5 MB unpacked), so
# that a device call can unpack, build and time them next to the current tree
# (scripts/device/ratio_old.sh). The device copies the working tree (≤ 64 MiB with .devdeps):
# remove the archives after.
# Usage: bash scripts/device/prepare_old_tree.sh SHA [SHA ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
for c in "$@"; do
  sha=$(git rev-parse --short "$c")
  d="old-$sha"
  rm -rf "$d" && mkdir "$d"
  git archive "$sha" | tar -x -C "$d" --exclude='models/default/model.safetensors'
  rm -rf "$d/tests/fixtures" "$d/tests/data" "$d/bench/results" "$d/docs"
  tar -cJf "$d.tar.xz" "$d" && rm -rf "$d"
  echo "$d.tar.xz $(du -sh "$d.tar.xz" | cut -f1)"
done
