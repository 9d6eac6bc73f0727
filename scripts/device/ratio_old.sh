#!/usr/bin/env bash
# Device: the served batch-1 decode step at 4K and 900K (bf16 KV + fp8 indexer keys, the issue-7
# ratio) for every old-<sha>.tar.xz archive of the tree (scripts/device/prepare_old_tree.sh) and for the
# current tree (built by run_gpu.sh unless build-gpu/v4serve exists), $V4_OLD_RUNS (3) runs each,
# one table -> $OUT/ratio-old.md. Each old tree builds v4serve in its own build-gpu/ (~2.5 min on
# 16 cores; the trees build in parallel unless V4_OLD_PARALLEL=0).
# From the developer machine: run(command="bash scripts/device/ratio_old.sh", carry=[".devdeps"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(pwd)/out-local}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/v4deps/usr/lib/x86_64-linux-gnu:/opt/v4deps/usr/lib/x86_64-linux-gnu/openblas-pthread
f=$OUT/ratio-old.md; R=$(mktemp -d)  # per-run tables and logs stay on the device (8-file limit)
{ echo "# Batch-1 decode at 4K and 900K per source tree (bf16 KV + fp8 indexer keys)"; echo
  echo "| tree | run | 4K ms/step | 900K ms/step | 900K / 4K |"; echo "|---|---:|---:|---:|---:|"; } > "$f"
time_tree() {  # time_tree <dir> <label> <run>
  for r in $3; do
    rm -f "$R/$2-$r.md"
    (cd "$1" && timeout 150 build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
      --num-layers 20 --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 \
      --index-cache-dtype fp8 --batch 1 --context 4K,900K --steps 20 --prefill-steps 1 \
      --prefill-warmup 0 --out "$R/$2-$r.md" > "$R/$2-$r.log" 2>&1)
    grep -E "^\| decode" "$R/$2-$r.md" | awk -F'|' '{gsub(/ /,"",$6); printf "%s ", $6}' |
      awk -v t="$2" -v r="$r" 'NF == 2 && $1 + 0 > 0 && $2 + 0 > 0 {
        printf "| %s | %d | %s | %s | %.3f |\n", t, r, $1, $2, $1 / $2; ok = 1 }
        END { if (!ok) printf "| %s | %d | failed | (see the run log) | |\n", t, r }' >> "$f"
  done
}
build_tree() {  # build_tree <dir>: v4serve in <dir>/build-gpu (run_gpu.sh, no tests or benches)
  [ "$1" != . ] && mkdir -p "$1/.devdeps" && cp .devdeps/* "$1/.devdeps/"
  local name=${1//\//}; name=${name/#./current}
  (cd "$1" && OUT=/tmp/ratio-old-build-$name V4_TARGETS=v4serve V4_SKIP_TESTS=1 V4_SKIP_BENCH=1 \
    V4_BUILD_JOBS=${jobs:-$(nproc)} \
    bash scripts/device/run_gpu.sh > /dev/null 2>&1)
  local rc=$?; echo "$1 build rc=$rc"
  [ $rc = 0 ] || tail -40 /tmp/ratio-old-build-$name/build.log > "$OUT/build-fail-$name.log"
}
for a in old-*.tar.xz; do [ -f "$a" ] && tar -xJf "$a"; done  # prepare_old_tree.sh's archives
trees=(); for d in old-*/; do [ -d "$d" ] && trees+=("${d%/}"); done
cur=${V4_OLD_CURRENT:-1}  # 0: old trees only
[ "$cur" = 1 ] && trees+=(.)  # (an up-to-date build-gpu/ of a warm machine rebuilds nothing)
if [ "${V4_OLD_PARALLEL:-1}" = 1 ] && [ ${#trees[@]} -gt 1 ]; then
  # Compile jobs per tree: twice the cores in all (nvcc's host phases leave cores idle), ≥ 4.
  jobs=$(( 2 * $(nproc) / ${#trees[@]} )); [ "$jobs" -ge 4 ] || jobs=4
  # All trees build at once (each build's tail is one long nvcc file, so one tree at a time leaves
  # most cores idle); the shared dependency folder is unpacked first, by one build alone.
  [ -d /opt/v4deps/usr ] || { mkdir -p /opt/v4deps && python3 -c "import tarfile; \
    tarfile.open('.devdeps/deps.tar.xz').extractall('/opt/v4deps', filter='tar')"; }
  for d in "${trees[@]}"; do build_tree "$d" & done
  wait; echo "builds done at ${SECONDS}s"
else
  for d in ${trees[@]+"${trees[@]}"}; do build_tree "$d"; done
fi
# Runs interleaved (every tree's run 1, then every tree's run 2, ...) so drift spreads evenly.
for r in $(seq 1 "${V4_OLD_RUNS:-3}"); do
  for d in ${trees[@]+"${trees[@]}"}; do
    label=$d; [ "$d" = . ] && label=current
    [ -x "$d/build-gpu/v4serve" ] && time_tree "$d" "$label" "$r"
  done
  echo "runs $r done at ${SECONDS}s"
done
cat "$f"
