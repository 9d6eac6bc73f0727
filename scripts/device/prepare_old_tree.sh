#!/usr/bin/env bash
# Developer machine: writes the source of commit(s) into untracked folders old-<sha>/ of this
# checkout (no .git, no weights, no test fixtures or results: ~4.5 MB each), so that a device call
# can build and time them next to the current tree (scripts/device/ratio_old.sh). The device
# copies the working tree (≤ 64 MiB with .devdeps): at most ~8 trees a call; remove them after.
# Usage: bash scripts/device/prepare_old_tree.sh SHA [SHA ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
for c in "$@"; do
  sha=$(git rev-parse --short "$c")
  d="old-$sha"
  rm -rf "$d" && mkdir "$d"
  git archive "$sha" | tar -x -C "$d" --exclude='models/default/model.safetensors'
  rm -rf "$d/tests/fixtures" "$d/tests/data" "$d/bench/results" "$d/docs"
  echo "$d $(du -sh "$d" | cut -f1)"
done
