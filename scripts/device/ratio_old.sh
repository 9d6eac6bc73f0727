#!/usr/bin/env bash
# Device: the served batch-1 decode step at 4K and 900K (bf16 KV + fp8 indexer keys, the issue-7
# ratio) for every old-<sha>/ folder of the tree (scripts/device/prepare_old_tree.sh) and for the
# current tree (built by run_gpu.sh unless build-gpu/v4serve exists), $V4_OLD_RUNS (3) runs each,
# one table -> $OUT/ratio-old.md. Each old tree builds v4serve in its own build-gpu/ (~2.5 min on
# 16 cores: ~3 trees per 10-minute call).
# From the developer machine: run(command="bash scripts/device/ratio_old.sh", carry=[".devdeps"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(pwd)/out-local}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/v4deps/usr/lib/x86_64-linux-gnu:/opt/v4deps/usr/lib/x86_64-linux-gnu/openblas-pthread
f=$OUT/ratio-old.md
{ echo "# Batch-1 decode at 4K and 900K per source tree (bf16 KV + fp8 indexer keys)"; echo
  echo "| tree | run | 4K ms/step | 900K ms/step | 900K / 4K |"; echo "|---|---:|---:|---:|---:|"; } > "$f"
time_tree() {  # time_tree <dir> <label>
  for r in $(seq 1 "${V4_OLD_RUNS:-3}"); do
    (cd "$1" && timeout 150 build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
      --num-layers 20 --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 \
      --index-cache-dtype fp8 --batch 1 --context 4K,900K --steps 20 --prefill-steps 1 \
      --prefill-warmup 0 --out "$OUT/ratio-old-$2-$r.md" > "$OUT/ratio-old-$2-$r.log" 2>&1)
    grep -E "^\| decode" "$OUT/ratio-old-$2-$r.md" | awk -F'|' '{gsub(/ /,"",$6); printf "%s ", $6}' |
      awk -v t="$2" -v r="$r" '{printf "| %s | %d | %s | %s | %.3f |\n", t, r, $1, $2, $1 / $2}' >> "$f"
  done
}
for d in old-*/; do
  [ -d "$d" ] || continue; d=${d%/}
  mkdir -p "$d/.devdeps" && cp .devdeps/* "$d/.devdeps/"
  (cd "$d" && OUT=$OUT/$d V4_TARGETS=v4serve V4_SKIP_TESTS=1 V4_SKIP_BENCH=1 bash scripts/device/run_gpu.sh > /dev/null 2>&1)
  echo "$d build rc=$?"; [ -x "$d/build-gpu/v4serve" ] && time_tree "$d" "$d"
done
if [ ! -x build-gpu/v4serve ]; then
  V4_TARGETS=v4serve V4_SKIP_TESTS=1 V4_SKIP_BENCH=1 bash scripts/device/run_gpu.sh > /dev/null 2>&1
fi
time_tree . "current"
cat "$f"
