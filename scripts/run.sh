#!/usr/bin/env bash
# Sets up (Debian packages + PyPI test deps), builds v4serve and runs the main job with the
# embedded default model in models/default: one greedy generation, then (with --serve) the
# OpenAI-compatible server on 127.0.0.1:30000.
# Usage: bash scripts/run.sh ["prompt text"] [--serve]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="The history of the"
serve=0
for a in "$@"; do
  if [ "$a" = "--serve" ]; then serve=1; else prompt="$a"; fi
done
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target v4serve
./build/v4serve generate --model models/default --prompt "$prompt" --max-new-tokens 48 --temperature 0
if [ "$serve" = 1 ]; then
  exec ./build/v4serve serve --model models/default --host 127.0.0.1 --port 30000
fi
