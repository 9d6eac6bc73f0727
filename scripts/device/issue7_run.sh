#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, one call): builds v4serve + test_cuda + bench_kernels,
# runs the GPU op tests, then the stages named in $V4_STAGES (default all, in this order):
#   compressor  bench_kernels --only-compressor  -> cuda-compressor.md
#   wformat     bench_kernels --only-wformat     -> cuda-wformat.md (GEMV / dense_mma / MoE tables)
#   gemv        bench_kernels --only-gemv        -> cuda-gemv.md (batch-1..4 GEMV: shared-memory
#               wgemv vs streaming gemv_stream, % of a same-traffic copy)
#   topk        bench_kernels --only-topk        -> cuda-topk.md
#   indexer     bench_kernels --only-indexer     -> cuda-indexer.md (decode scores kernel vs WMMA)
#   topkprof    bench_kernels --profile-indexer-topk DTYPE COUNT MAX_N VARIANT per entry of
#               $V4_TOPKPROF (dtype:count:max_n:variant): the top-k on the indexer's scores
#   idxprof     bench_kernels --launches 200 --profile-indexer DTYPE KEYS VARIANT per entry of
#               $V4_IDXPROF (dtype:keys:variant, e.g. "bf16:230400:0 fp8:230400:20")
#               -> cuda-indexer-profile.md (not in the default stage list)
#   gather      bench_kernels --probe-indexer-gather -> cuda-indexer-gather.md (the decode scores
#               kernel vs its loads alone, random vs sequential lists; not in the default list)
#   attention   bench_kernels --only-attention   -> cuda-attention.md
#   attngather  bench_kernels --probe-attention-gather -> cuda-attention-gather.md (variant 11's
#               key-row ring without math: cp.async vs TMA vs bulk copies; not in the default
#               stage list)
#   attnwg      bench_kernels --only-attention-wg -> cuda-attention-wg.md (bf16 pools: the default
#               kernels vs the warpgroup-MMA variants 7 / 8 and their split sweeps; not in the
#               default stage list)
#   mhc         bench_kernels --only-mhc         -> cuda-mhc.md (fused mHC old vs new)
#   moe         bench_kernels --only-moe         -> cuda-moe.md (routed MoE moe_mma v1 vs v2 vs the
#               byte floor, MXFP4 + FP8, S = 1…512; gmoe 4 vs 8 warps at prefill sizes); also
#               decode at batch 1,64 with V4_MOE_MMA_VERSION=1, 2 and 3 (4K)
#               -> bench-v4flash-20l-moe-v1v2.md
#   ncu-cproj   ncu of the compressor projection kernel (compress_proj_kernel) in the bench's case
#               $V4_CPROJ_CASE (B:shape, default "1:0": batch 1, CSA kv) -> ncu-cproj.txt
#   ncu-cpool   ncu of the pooling kernel (compress_fused_rows_kernel) in the pooling table's cases
#               $V4_CPOOL_CASES ("scenario:shape ...", default "0:2 0:1 0:0": prefill 8K C128, C4
#               d128, C4 d512) -> ncu-cpool.txt (not in the default stage list)
#   cpoolenv    the pooling table for each case of $V4_CPOOL_CASES once per env set of
#               $V4_CPOOL_ENVS ("default V4_COMPRESS_UNROLL=8 ...") -> cuda-compressor-envs.md
#               (not in the default stage list)
#   ncu-gemv    ncu of two batch-1 FP8 GEMVs (bench_kernels --profile-gemv) -> logs.tgz
#               (the streaming kernel; V4_GEMV_STREAM=0 profiles the shared-memory one)
#   decode      v4serve bench --profile on the V4-Flash-shaped dummy model (20 layers, bf16):
#               decode at batch $V4_BATCH × context $V4_CONTEXT with the byte floor and the
#               per-region split, and prefill per context -> bench-v4flash-20l-after.md
#   kvbf16      the decode stage again with --kv-cache-dtype bf16 (bf16 KV pools and indexer keys)
#               -> bench-v4flash-20l-kvbf16.md
#   kvfp8       the decode stage again with --kv-cache-dtype fp8 (608-byte e4m3 + bf16-rope rows,
#               132-byte fp8 indexer keys since idxfp8) -> bench-v4flash-20l-kvfp8.md
#   kvacc       bench_kv_accuracy --device cuda: attention error and fixture greedy agreement of
#               f32 / bf16 / fp8 pools on the GPU -> kv-fp8-accuracy-cuda.md
#   ratio       v4serve bench at batch 1, 4K and 900K, no profile (multi-stream branches overlap as
#               served), once per KV type in $V4_RATIO_KV (bf16) and attention_dec variant in
#               $V4_RATIO_ATTN (auto), $V4_RATIO_REPEAT times each (1), with a summary of the
#               900K / 4K ratios (min, mean, max) on top -> bench-v4flash-20l-ratio.md
#   attnb64     v4serve bench at batch $V4_B64_BATCH (64) × 4K and 128K (bf16 KV + fp8 indexer keys),
#               once per V4_ATTN_DEC in $V4_B64_ATTN ("2 9 auto"; an entry may add env settings:
#               "auto:V4_ATTN_DEC_CLUSTER=0") -> bench-v4flash-20l-attn-b64.md
#               (decode attention kernels end to end at batch 64; not in the default stage list)
#   ratioenv    the ratio measurement (bf16 KV; batch $V4_RATIO_BATCH (1), contexts $V4_RATIO_CONTEXT
#               (4K,900K)) once per env set in $V4_RATIO_ENVS
#               (e.g. "default V4_INDEXER_DEC=2"; V4_RATIO_PROFILE=1 adds --profile to every run, an
#               entry's PROFILE=1 pair to that run only, e.g. "PROFILE=1,V4_ATTN_DEC_LEAN=0": per-region
#               tables, branches serialised) -> bench-v4flash-20l-ratio-ab.md (A/B of kernel
#               switches end to end; not in the default stage list)
#   idxpfk      bench_kernels --only-indexer-prefill -> cuda-indexer-prefill.md (prefill indexer
#               scores: the warpgroup-MMA kernel, its e4m3 mode and the WMMA kernel)
#   gmoe        bench_kernels --only-gmoe -> cuda-gmoe.md (the routed experts at prefill sizes: the
#               grouped kernels and their variants; not in the default stage list)
#   pfab        v4serve bench prefill A/B of env settings ($V4_PFAB_RUNS, see below)
#               -> bench-v4flash-20l-pfab.md (not in the default stage list)
#   ncupf       ncu sections of one kernel in a prefill step ($V4_NCUPF_KERNEL, default
#               mhc_fused_kernel) -> ncu-prefill-kernel.txt (not in the default stage list)
#   pfkern      ncu of every kernel of one prefill and one decode step (V4_BENCH_PROFILER)
#               -> ncu-kernels.md (not in the default stage list)
#   idxpf       (removed in session 18: the pfab stage does it —
#               V4_PFAB_RUNS="V4_INDEXER_PREFILL_WG=0 default" V4_PFAB_CONTEXT=128K,900K;
#               bench-v4flash-20l-idxpf.md came from the old stage)
#   idxpdl      v4serve bench --kv-cache-dtype bf16 at batch $V4_IDXPDL_BATCH (1) × 4K and 900K,
#               no profile (as served), with V4_INDEXER_PDL=0 and =1 (the indexer chain's plain
#               launches vs programmatic dependent launch, docs/cuda.md §Indexer chain)
#               -> bench-v4flash-20l-idxpdl.md (not in the default stage list)
#   idxdec      v4serve bench at batch $V4_IDXDEC_BATCH (1) × 4K and 900K, no profile, per KV type in
#               $V4_IDXDEC_KV (bf16,fp8) with V4_INDEXER_DEC in $V4_IDXDEC_VARIANTS (0 4 5 6: the
#               indexer scores decode kernel vs its pipelined form; 8 9: the wgmma kernel, bf16
#               keys only — V4_IDXDEC_KV=bf16 V4_IDXDEC_VARIANTS="0 8 9"; docs/cuda.md §Indexer scores)
#               -> bench-v4flash-20l-idxdec.md (not in the default stage list)
#   mstream     v4serve bench --multi-stream off,on (no profile: the region profile runs
#               branches serially) at batch $V4_MS_BATCH × 4K -> bench-v4flash-20l-mstream.md
# Results under $OUT (≤ 8 files come back): the tables above and logs.tgz (device.log, build.log,
# cuda-op-tests.log, every program's full output).
# Env: V4_GTEST_FILTER (default "*"), V4_SKIP_BUILD=1 (warm machine), V4_LAYERS (20),
#   V4_RATIO_STEPS (timed decode steps of the ratio / ratioenv runs, default 20),
#   V4_BATCH (1,64), V4_CONTEXT (4K,128K,900K,1M), V4_MS_BATCH (1,64), V4_STEPS (5),
#   V4_GEMV_STREAM=0 (every wgemv call, decode included, runs the shared-memory kernel: A/B),
#   V4_BENCH_EXTRA (more v4serve bench flags, e.g. "--prefill-steps 1 --prefill-warmup 0"),
#   V4_BUILD_TARGETS (default "v4serve test_cuda bench_kernels bench_kv_accuracy"; with
#   V4_SKIP_TESTS=1 a v4serve-only build for end-to-end stages), V4_TEST_SHARDS (parallel gtest shards, run_gpu.sh), V4_MOE_E2E (moe_mma versions the moe stage runs end to end; default "1 2 3", "" = none).
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/issue7_run.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
if [ "${V4_SKIP_BUILD:-0}" = 1 ] && [ -x build-gpu/v4serve ]; then
  echo "skip build (warm machine)"
  V4_GTEST_FILTER="${V4_GTEST_FILTER:-*}" V4_REQUIRE_GPU=1 \
    build-gpu/tests/test_cuda --gtest_filter="${V4_GTEST_FILTER:-*}" --gtest_color=no \
    > "$OUT/cuda-op-tests.log" 2>&1
  echo "test_cuda rc=$?"; grep -E "FAILED|PASSED" "$OUT/cuda-op-tests.log" | head -20
else
  V4_TARGETS="${V4_BUILD_TARGETS:-v4serve test_cuda bench_kernels bench_kv_accuracy}" V4_SKIP_BENCH=1 \
    V4_GTEST_FILTER="${V4_GTEST_FILTER:-*}" bash scripts/device/run_gpu.sh > /dev/null 2>&1
  echo "build+tests rc=$?"; grep -E "^\[  FAILED|PASSED|build FAILED|error" "$OUT/device.log" | head -30
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
export V4_DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
stages=" ${V4_STAGES:-compressor wformat gemv topk indexer idxpfk attention mhc decode mstream} "
has() { [[ "$stages" == *" $1 "* ]]; }
logs=()
kb() {  # kb <stage> <flag>
  timeout "${V4_KB_TIMEOUT:-240}" stdbuf -oL build-gpu/bench/bench_kernels --out "$OUT" "$2" > "$OUT/$1.log" 2>&1
  echo "$1 bench rc=$?"; logs+=("$1.log")
}
has compressor && kb compressor --only-compressor
has wformat && { kb wformat --only-wformat; grep -E "^(gemv|moe|dense)" "$OUT/wformat.log"; }
has gemv && { kb gemv --only-gemv; grep -E "^gemv" "$OUT/gemv.log"; }
has topk && kb topk --only-topk
has indexer && { kb indexer --only-indexer; grep -E "^indexer" "$OUT/indexer.log"; }
has idxpfk && { kb idxpfk --only-indexer-prefill; grep -E "^indexer prefill" "$OUT/idxpfk.log"; }
has gmoe && { kb gmoe --only-gmoe; grep -E "^gmoe" "$OUT/gmoe.log"; }
has gather && { kb gather --probe-indexer-gather; grep -E "^indexer gather" "$OUT/gather.log"; }
if has idxprof; then  # scores kernel per variant: bench_kernels --profile-indexer, µs per launch
  f="$OUT/cuda-indexer-profile.md"
  { echo "# Indexer scores kernel per variant (bench_kernels --launches 200 --profile-indexer)"; echo
    echo "- GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit $V4_COMMIT; $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- cases (dtype:keys:variant): ${V4_IDXPROF:-bf16:230400:0 fp8:230400:3 fp8:230400:20 fp8:1024:3 fp8:1024:20}"
    echo; echo '```'; } > "$f"
  for c in ${V4_IDXPROF:-bf16:230400:0 fp8:230400:3 fp8:230400:20 fp8:1024:3 fp8:1024:20}; do
    IFS=: read -r dt n v <<< "$c"
    timeout 60 build-gpu/bench/bench_kernels --launches 200 --profile-indexer "$dt" "$n" "$v" 2>&1 |
      grep "time" | tee -a "$f"
  done
  echo '```' >> "$f"
fi
if has topkprof; then  # the top-k on the indexer's own scores, grid sized as in the step
  f="$OUT/cuda-indexer-topk-profile.md"
  tp=${V4_TOPKPROF:-fp8:230400:262144:0 bf16:230400:262144:0 fp8:230400:262144:37 bf16:230400:262144:37}
  { echo "# Lightning TopK on the indexer's scores (bench_kernels --profile-indexer-topk)"; echo
    echo "- GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit $V4_COMMIT; $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- cases (key dtype:count:max_n:topk variant): $tp"
    echo; echo '```'; } > "$f"
  for c in $tp; do
    IFS=: read -r dt n m v <<< "$c"
    timeout 90 build-gpu/bench/bench_kernels --profile-indexer-topk "$dt" "$n" "$m" "$v" 2>&1 |
      grep "time" | tee -a "$f"
  done
  echo '```' >> "$f"
fi
has attention && kb attention --only-attention
has attnwg && { kb attnwg --only-attention-wg; grep -E "^\|" "$OUT/attnwg.log"; }
has attngather && { kb attngather --probe-attention-gather; grep -E "^attention gather" "$OUT/attngather.log"; }
has mhc && { kb mhc --only-mhc; grep -E "^\| mHC" "$OUT/mhc.log"; }
has moe && { V4_KB_TIMEOUT=${V4_KB_TIMEOUT:-420} kb moe --only-moe; grep -E "^g?moe" "$OUT/moe.log"; }
if has ncu-cproj && command -v ncu >/dev/null; then  # the projection kernel's memory behaviour
  V4_COMPRESS_PROJ_ONLY=1 V4_COMPRESS_PROJ_CASE=${V4_CPROJ_CASE:-1:0} timeout 150 ncu --clock-control none \
    --kernel-name regex:'compress_proj_kernel' --launch-skip 6 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    build-gpu/bench/bench_kernels --out "$OUT/ncu-tmp" --only-compressor > "$OUT/ncu-cproj.txt" 2>&1
  echo "ncu-cproj rc=$?"; cp "$OUT/ncu-cproj.txt" "$OUT/ncu-cproj.log"; logs+=(ncu-cproj.log)
  grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Stall|L2 Hit|Warp Cycles Per Issued" "$OUT/ncu-cproj.txt" | head -40
fi
if has ncu-cpool && command -v ncu >/dev/null; then  # the pooling kernel in chosen bench cases
  # $V4_CPOOL_CASES: "scenario:shape" of the pooling table (0 prefill 8K, 2 decode B=64;
  # 0 C4 d512, 1 C4 d128, 2 C128 d512); the first fused launches of each case.
  : > "$OUT/ncu-cpool.txt"; mkdir -p "$OUT/ncu-tmp"
  for c in ${V4_CPOOL_CASES:-0:2 0:1 0:0}; do
    echo "=== case $c" >> "$OUT/ncu-cpool.txt"
    V4_COMPRESS_POOL_CASE=$c timeout 150 ncu --clock-control none \
      --kernel-name regex:'compress_fused_rows_kernel' --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats \
      build-gpu/bench/bench_kernels --out "$OUT/ncu-tmp" --only-compressor >> "$OUT/ncu-cpool.txt" 2>&1
    echo "ncu-cpool $c rc=$?"
  done
  grep -E "^=== case|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Waves Per|Warp Cycles Per Issued|Block Limit" "$OUT/ncu-cpool.txt" | head -60
fi
if has cpoolenv; then  # the pooling bench for one case per env set: "ENV=V,ENV2=V2" or "default"
  f="$OUT/cuda-compressor-envs.md"
  { echo "# FlashCompressor pooling kernel: env A/B per case"; echo
    echo "- GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); commit $V4_COMMIT; $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- cases: ${V4_CPOOL_CASES:-0:2 0:1}; env sets: ${V4_CPOOL_ENVS:-default}"; echo; } > "$f"
  mkdir -p "$OUT/cpool-tmp"
  for c in ${V4_CPOOL_CASES:-0:2 0:1}; do
    for e in ${V4_CPOOL_ENVS:-default}; do
      envs=(); [ "$e" != default ] && IFS=, read -ra envs <<< "$e"
      env "${envs[@]}" V4_COMPRESS_POOL_CASE=$c timeout 120 build-gpu/bench/bench_kernels \
        --out "$OUT/cpool-tmp" --only-compressor > "$OUT/cpool-$c-$e.log" 2>&1
      echo "cpoolenv $c $e rc=$?"
      { echo "## case $c, $e"; echo; grep -E "^\| (prefill|decode)" "$OUT/cpool-tmp/cuda-compressor.md"; echo; } >> "$f"
      logs+=("cpool-$c-$e.log")
    done
  done
  grep -E "^## |\| fused \(" "$f" | head -40
fi
if has ncu-gemv && command -v ncu >/dev/null; then  # why batch-1 FP8 GEMVs reach ~35% of copy BW
  timeout 120 ncu --clock-control none --kernel-name regex:'wgemv_kernel|gemv_stream_kernel' --launch-skip 20 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    build-gpu/bench/bench_kernels --profile-gemv > "$OUT/ncu-gemv.txt" 2>&1
  echo "ncu gemv rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall" "$OUT/ncu-gemv.txt" | head -30
  logs+=(ncu-gemv.txt)
fi
unset V4_MULTI_STREAM
common=(--model models/configs/v4-flash --load-format dummy --num-layers "${V4_LAYERS:-20}"
        --device cuda --precision bf16 --mem-fraction 0.9)
if has decode; then
  timeout 240 build-gpu/v4serve bench "${common[@]}" --batch "${V4_BATCH:-1,64}" \
    --context "${V4_CONTEXT:-4K,128K,900K,1M}" --steps "${V4_STEPS:-5}" --profile ${V4_BENCH_EXTRA:-} \
    --out "$OUT/bench-v4flash-20l-after.md" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-after.md"
  logs+=(bench.log)
fi
if has kvbf16; then
  timeout 240 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype bf16 --batch "${V4_BATCH:-1,64}" \
    --context "${V4_CONTEXT:-4K,128K,900K,1M}" --steps "${V4_STEPS:-5}" --profile ${V4_BENCH_EXTRA:-} \
    --out "$OUT/bench-v4flash-20l-kvbf16.md" > "$OUT/bench-kvbf16.log" 2>&1
  echo "bench (kv bf16) rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-kvbf16.md"
  logs+=(bench-kvbf16.log)
fi
if has moe && [ -n "${V4_MOE_E2E-1 2 3}" ]; then  # end to end: old moe_mma vs new (env switch)
  for v in ${V4_MOE_E2E-1 2 3}; do
    V4_MOE_MMA_VERSION=$v timeout 200 build-gpu/v4serve bench "${common[@]}" --batch 1,64 \
      --context 4K --steps "${V4_STEPS:-5}" --profile ${V4_BENCH_EXTRA:-} \
      --out "$OUT/bench-moe-v$v.md" > "$OUT/bench-moe-v$v.log" 2>&1
    echo "bench moe v$v rc=$?"; grep -E "^\| (decode)" "$OUT/bench-moe-v$v.md"
    logs+=(bench-moe-v$v.log)
  done
  { echo "# V4-Flash 20 layers, 4K: moe_mma version 1 (old) vs 2 (new) vs 3 (experimental)"; echo;
    for v in ${V4_MOE_E2E-1 2 3}; do echo "## V4_MOE_MMA_VERSION=$v"; echo; cat "$OUT/bench-moe-v$v.md"; echo; done
  } > "$OUT/bench-v4flash-20l-moe-v1v2.md"
  rm -f "$OUT/bench-moe-v1.md" "$OUT/bench-moe-v2.md" "$OUT/bench-moe-v3.md"
fi
if has kvfp8; then
  timeout 240 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype fp8 --batch "${V4_BATCH:-1,64}" \
    --context "${V4_CONTEXT:-4K,128K,900K,1M}" --steps "${V4_STEPS:-5}" --profile ${V4_BENCH_EXTRA:-} \
    --out "$OUT/bench-v4flash-20l-kvfp8.md" > "$OUT/bench-kvfp8.log" 2>&1
  echo "bench (kv fp8) rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-kvfp8.md"
  logs+=(bench-kvfp8.log)
fi
if has kvacc; then
  timeout 200 build-gpu/bench/bench_kv_accuracy --device cuda --out "$OUT/kv-fp8-accuracy-cuda.md" \
    > "$OUT/kvacc.log" 2>&1
  echo "bench_kv_accuracy rc=$?"; grep -E "^\| .*fp8" "$OUT/kv-fp8-accuracy-cuda.md" | head -12
  logs+=(kvacc.log)
fi
if has ratio; then  # issue 7: decode tok/s at 900K vs 4K as served (no profile: branches overlap)
  # V4_RATIO_KV: KV element types (default bf16; "bf16+fp8idx" = --kv-cache-dtype bf16
  # --index-cache-dtype fp8); V4_RATIO_ATTN: attention_dec variants (V4_ATTN_DEC; default: the
  # auto choice); V4_RATIO_REPEAT: runs per pair (default 1; the run-to-run spread at 900K is
  # ~±0.04 ms). One table per run, all in the one file, after a summary of every run's
  # 900K / 4K tok/s ratio (min, mean, max per pair).
  body=$OUT/ratio-body.md; : > "$body"; summary=$OUT/ratio-summary.tsv; : > "$summary"
  for kvspec in ${V4_RATIO_KV:-bf16}; do
    kv=${kvspec%%+*}; idx=()
    [[ "$kvspec" == *+fp8idx ]] && idx=(--index-cache-dtype fp8)
    for av in ${V4_RATIO_ATTN:-auto}; do
      if [ "$av" = auto ]; then unset V4_ATTN_DEC; else export V4_ATTN_DEC=$av; fi
      for rep in $(seq 1 "${V4_RATIO_REPEAT:-1}"); do
        tag=$kvspec-$av-$rep
        timeout 200 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype "$kv" "${idx[@]}" \
          --batch 1 --context 4K,900K --steps ${V4_RATIO_STEPS:-20} --prefill-steps 1 --prefill-warmup 0 \
          --out "$OUT/ratio-$tag.md" > "$OUT/bench-ratio-$tag.log" 2>&1
        echo "bench (900K vs 4K, kv $kvspec, V4_ATTN_DEC=$av, run $rep) rc=$?"; grep -E "^\| (decode)" "$OUT/ratio-$tag.md"
        grep -E "^\| decode" "$OUT/ratio-$tag.md" | awk -F'|' -v k="$kvspec" -v a="$av" -v r="$rep" \
          '{gsub(/ /, "", $3); gsub(/ /, "", $6); gsub(/ /, "", $8); printf "%s\t%s\t%s\t%s\t%s\t%s\n", k, a, r, $3, $6, $8}' >> "$summary"
        { echo "## --kv-cache-dtype $kv ${idx[*]}, V4_ATTN_DEC=$av, run $rep"; echo; cat "$OUT/ratio-$tag.md"; echo; } >> "$body"
        rm -f "$OUT/ratio-$tag.md"; logs+=(bench-ratio-$tag.log)
      done
    done
  done
  unset V4_ATTN_DEC
  { python3 scripts/device/ratio_summary.py "$summary"; echo; cat "$body"; } > "$OUT/bench-v4flash-20l-ratio.md"
  rm -f "$body" "$summary"
fi
if has attnb64; then  # decode at batch $V4_B64_BATCH (64) × 4K / 128K per attention_dec variant
  # V4_B64_ATTN: V4_ATTN_DEC values (default "2 9 auto": the mma.sync kernel, the swizzled
  # warpgroup kernel, today's auto choice = variant 11 above 4 rows); bf16 KV + fp8 indexer keys
  # as served; one table per variant, all in bench-v4flash-20l-attn-b64.md.
  # An entry may carry env settings after a colon: "auto:V4_ATTN_DEC_CLUSTER=0,VAR=VALUE".
  body=$OUT/bench-v4flash-20l-attn-b64.md; : > "$body"
  n=0
  for entry in ${V4_B64_ATTN:-2 9 auto}; do
    n=$((n + 1)); av=${entry%%:*}; envs=()
    [[ "$entry" == *:* ]] && IFS=, read -r -a envs <<< "${entry#*:}"
    if [ "$av" = auto ]; then unset V4_ATTN_DEC; else export V4_ATTN_DEC=$av; fi
    env "${envs[@]}" timeout 240 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype bf16 --index-cache-dtype fp8 \
      --batch "${V4_B64_BATCH:-64}" --context 4K,128K --steps ${V4_B64_STEPS:-10} --prefill-steps 1 \
      --prefill-warmup 0 --out "$OUT/b64-$n.md" > "$OUT/bench-b64-$n.log" 2>&1
    echo "bench (batch ${V4_B64_BATCH:-64}, V4_ATTN_DEC=$entry) rc=$?"; grep -E "^\| (decode)" "$OUT/b64-$n.md"
    { echo "## V4_ATTN_DEC=$entry"; echo; cat "$OUT/b64-$n.md"; echo; } >> "$body"
    rm -f "$OUT/b64-$n.md"; logs+=(bench-b64-$n.log)
  done
  unset V4_ATTN_DEC
fi
if has ratioenv; then  # 900K vs 4K decode (batch 1, bf16 KV, as served) under several env sets
  # V4_RATIO_ENVS: space-separated entries, each "default" or comma-separated VAR=VALUE pairs
  # (e.g. "default V4_INDEXER_DEC=2 V4_INDEXER_DEC=2,V4_ATTN_DEC=6"); one table per entry;
  # V4_RATIO_EXTRA: more bench arguments for every entry (e.g. "--index-cache-dtype fp8").
  : > "$OUT/bench-v4flash-20l-ratio-ab.md"; sum=$OUT/ratioenv-summary.md
  { echo "| entry | env | 4K ms/step | 900K ms/step | 900K / 4K |"; echo "|---:|---|---:|---:|---:|"; } > "$sum"
  i=0
  for e in ${V4_RATIO_ENVS:-default}; do
    i=$((i + 1)); envs=()
    [ "$e" != default ] && IFS=, read -r -a envs <<< "$e"
    prof=${V4_RATIO_PROFILE:+--profile}
    [[ ",$e," == *",PROFILE=1,"* ]] && prof=--profile  # entry-level "PROFILE=1": this run only
    env "${envs[@]}" timeout 150 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype bf16 ${V4_RATIO_EXTRA:-} \
      --batch ${V4_RATIO_BATCH:-1} --context ${V4_RATIO_CONTEXT:-4K,900K} --steps ${V4_RATIO_STEPS:-20} --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 256 \
      $prof --out "$OUT/ratioenv-$i.md" > "$OUT/bench-ratioenv-$i.log" 2>&1
    echo "bench (900K vs 4K, $e) rc=$?"; grep -E "^\| (decode)" "$OUT/ratioenv-$i.md"
    grep -E "^\| decode" "$OUT/ratioenv-$i.md" | awk -F'|' '{gsub(/ /,"",$6); printf "%s ", $6}' |
      awk -v i="$i" -v e="$e" 'NF == 2 && $1 + 0 > 0 && $2 + 0 > 0 {printf "| %d | %s | %s | %s | %.3f |\n", i, e, $1, $2, $1 / $2}' >> "$sum"
    { echo "## env: $e"; echo; cat "$OUT/ratioenv-$i.md"; echo; } >> "$OUT/bench-v4flash-20l-ratio-ab.md"
    rm -f "$OUT/ratioenv-$i.md"; logs+=(bench-ratioenv-$i.log)
  done
  # Summary first (one row per entry; a two-context run's 900K / 4K ratio), then every table.
  { echo "# 900K vs 4K decode per env entry"; echo; cat "$sum"; echo; cat "$OUT/bench-v4flash-20l-ratio-ab.md"; } > "$sum.tmp"
  mv "$sum.tmp" "$OUT/bench-v4flash-20l-ratio-ab.md"; rm -f "$sum"; cat "$OUT/bench-v4flash-20l-ratio-ab.md" | head -60
fi
if has pfab; then  # prefill end to end, A/B of env settings: V4_PFAB_RUNS (entries of comma-separated
  # VAR=VAL pairs, "default" = none; e.g. "default V4_GMOE_WG_VARIANT=5,V4_GROUPED_BATCHED=0"), or
  # one switch $V4_PFAB_VAR (V4_GMOE_WGMMA) over $V4_PFAB_VALUES ("0 1")
  f="$OUT/bench-v4flash-20l-pfab.md"
  runs="${V4_PFAB_RUNS:-}"
  if [ -z "$runs" ]; then
    for v in ${V4_PFAB_VALUES:-0 1}; do runs="$runs ${V4_PFAB_VAR:-V4_GMOE_WGMMA}=$v"; done
  fi
  echo "# Prefill A/B: $runs" > "$f"; echo >> "$f"
  n=0
  for r in $runs; do
    n=$((n + 1)); envs=()
    [ "$r" != default ] && IFS=, read -r -a envs <<< "$r"
    env "${envs[@]}" timeout 200 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype bf16 \
      ${V4_PFAB_EXTRA:---index-cache-dtype fp8} --batch 1 --context ${V4_PFAB_CONTEXT:-128K} \
      --steps 3 --prefill-steps 1 --prefill-warmup 1 --prefill-chunk ${V4_PFAB_CHUNK:-2048} \
      ${V4_PFAB_PROFILE:+--profile} --out "$OUT/pfab-$n.md" > "$OUT/bench-pfab-$n.log" 2>&1
    echo "bench ($r) rc=$?"; grep -E "^\| (prefill)" "$OUT/pfab-$n.md"
    { echo "## $r"; echo; cat "$OUT/pfab-$n.md"; echo; } >> "$f"
    rm -f "$OUT/pfab-$n.md"; logs+=(bench-pfab-$n.log)
  done
fi
if has pfkern && command -v ncu >/dev/null; then  # every kernel of one prefill / decode step
  # (ncu --profile-from-start off around the step: v4serve bench V4_BENCH_PROFILER; clocks and
  # caches left alone; kernels serialised) -> ncu-kernels.md: per phase the kernels grouped by
  # name and every launch in order. $V4_PFKERN_PHASES ("prefill decode"),
  # $V4_PFKERN_LAYERS (4: two SWA, one CSA, one HCA layer),
  # $V4_PFKERN_CONTEXT (128K), $V4_PFKERN_BATCH (1), $V4_PFKERN_CHUNK (2048)
  f="$OUT/ncu-kernels.md"
  { echo "# Kernels of one step: V4-Flash shape, ${V4_PFKERN_LAYERS:-4} layers, ncu"; echo
    echo "- commit: $(cat .devdeps/commit 2>/dev/null), date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"; echo; } > "$f"
  for ph in ${V4_PFKERN_PHASES:-prefill decode}; do
    echo "- $ph: \`V4_BENCH_PROFILER=$ph ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread v4serve bench ... --num-layers ${V4_PFKERN_LAYERS:-4} --batch ${V4_PFKERN_BATCH:-1} --context ${V4_PFKERN_CONTEXT:-128K} --prefill-chunk ${V4_PFKERN_CHUNK:-2048} --kv-cache-dtype bf16 --index-cache-dtype fp8\`" >> "$f"
    V4_BENCH_PROFILER=$ph timeout 240 ncu --profile-from-start off --clock-control none \
      --cache-control none -f -o "$OUT/pfkern-$ph" \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy \
      --num-layers "${V4_PFKERN_LAYERS:-4}" --device cuda --precision bf16 --mem-fraction 0.9 \
      --kv-cache-dtype bf16 --index-cache-dtype fp8 --batch "${V4_PFKERN_BATCH:-1}" \
      --context "${V4_PFKERN_CONTEXT:-128K}" --steps 1 --warmup 2 --prefill-steps 1 \
      --prefill-warmup 1 --prefill-chunk "${V4_PFKERN_CHUNK:-2048}" \
      --out "$OUT/pfkern-$ph-bench.md" > "$OUT/pfkern-$ph.log" 2>&1
    echo "ncu $ph rc=$?"
    ncu --import "$OUT/pfkern-$ph.ncu-rep" --page raw --csv > "$OUT/pfkern-$ph.csv" 2>> "$OUT/pfkern-$ph.log"
    logs+=(pfkern-$ph.log pfkern-$ph.csv)
  done
  echo >> "$f"
  for ph in ${V4_PFKERN_PHASES:-prefill decode}; do
    python3 scripts/device/kernel_table.py "$ph step (batch ${V4_PFKERN_BATCH:-1}, context ${V4_PFKERN_CONTEXT:-128K}$([ $ph = prefill ] && echo ", ${V4_PFKERN_CHUNK:-2048} tokens"))" "$OUT/pfkern-$ph.csv" >> "$f"
  done
  grep -A14 "^| kernel | launches" "$f" | head -40
  rm -f "$OUT"/pfkern-*.ncu-rep "$OUT"/pfkern-*-bench.md
fi
if has ncupf && command -v ncu >/dev/null; then  # ncu sections of one kernel inside a prefill step
  # ($V4_NCUPF_KERNEL regex, default mhc_fused_kernel; $V4_NCUPF_COUNT (1) launches after skipping
  # $V4_NCUPF_SKIP (1) in the step)
  # -> ncu-prefill-kernel.txt
  V4_BENCH_PROFILER=prefill timeout 240 ncu --profile-from-start off --clock-control none \
    --kernel-name regex:"${V4_NCUPF_KERNEL:-mhc_fused_kernel}" --launch-skip "${V4_NCUPF_SKIP:-1}" \
    --launch-count "${V4_NCUPF_COUNT:-1}" --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy --num-layers 4 \
    --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 --index-cache-dtype fp8 \
    --batch 1 --context 128K --steps 1 --warmup 1 --prefill-steps 1 --prefill-warmup 1 \
    --prefill-chunk "${V4_PFKERN_CHUNK:-2048}" > "$OUT/ncu-prefill-kernel.txt" 2>&1
  echo "ncupf rc=$?"
  grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots|Eligible|No Eligible|Stall|Block Limit|Grid Size" "$OUT/ncu-prefill-kernel.txt" | head -40
fi
if has idxpdl; then  # the indexer chain's PDL end to end: V4_INDEXER_PDL=0 (plain) vs 1 (default)
  : > "$OUT/bench-v4flash-20l-idxpdl.md"
  for p in 0 1; do
    V4_INDEXER_PDL=$p timeout 200 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype bf16 \
      --batch "${V4_IDXPDL_BATCH:-1}" --context 4K,900K --steps 20 --prefill-steps 1 \
      --prefill-warmup 0 --out "$OUT/idxpdl-$p.md" > "$OUT/bench-idxpdl-$p.log" 2>&1
    echo "bench (V4_INDEXER_PDL=$p) rc=$?"; grep -E "^\| (decode)" "$OUT/idxpdl-$p.md"
    { echo "## V4_INDEXER_PDL=$p"; echo; cat "$OUT/idxpdl-$p.md"; echo; } >> "$OUT/bench-v4flash-20l-idxpdl.md"
    rm -f "$OUT/idxpdl-$p.md"; logs+=(bench-idxpdl-$p.log)
  done
fi
if has idxdec; then  # the pipelined indexer scores kernel end to end: V4_INDEXER_DEC=N
  : > "$OUT/bench-v4flash-20l-idxdec.md"
  for kv in ${V4_IDXDEC_KV:-bf16 fp8}; do
    for v in ${V4_IDXDEC_VARIANTS:-0 4 5 6}; do
      V4_INDEXER_DEC=$v timeout 200 build-gpu/v4serve bench "${common[@]}" --kv-cache-dtype $kv \
        --batch "${V4_IDXDEC_BATCH:-1}" --context 4K,900K --steps 20 --prefill-steps 1 \
        --prefill-warmup 0 --out "$OUT/idxdec-$kv-$v.md" > "$OUT/bench-idxdec-$kv-$v.log" 2>&1
      echo "bench (kv $kv, V4_INDEXER_DEC=$v) rc=$?"; grep -E "^\| (decode)" "$OUT/idxdec-$kv-$v.md"
      { echo "## --kv-cache-dtype $kv, V4_INDEXER_DEC=$v"; echo; cat "$OUT/idxdec-$kv-$v.md"; echo; } \
        >> "$OUT/bench-v4flash-20l-idxdec.md"
      rm -f "$OUT/idxdec-$kv-$v.md"; logs+=(bench-idxdec-$kv-$v.log)
    done
  done
fi
if has mstream; then
  timeout 200 build-gpu/v4serve bench "${common[@]}" --batch "${V4_MS_BATCH:-1,64}" --context 4K \
    --steps 20 --prefill-steps 2 --multi-stream off,on \
    --out "$OUT/bench-v4flash-20l-mstream.md" > "$OUT/bench-mstream.log" 2>&1
  echo "bench (multi-stream off,on) rc=$?"; grep -E "^\| (decode|prefill)" "$OUT/bench-v4flash-20l-mstream.md"
  logs+=(bench-mstream.log)
fi
# At most 8 files come back: the .md tables stay loose, every log goes into logs.tgz (the test log
# and device.log too; their summary lines are printed above).
cd "$OUT" && grep -hE "^\[  (PASSED|FAILED)|tests? rc=" cuda-op-tests.log device.log 2>/dev/null | head -20
cd "$OUT" && tar czf /tmp/v4-logs.tgz --exclude='*.md' . && mv /tmp/v4-logs.tgz logs.tgz &&
  find . -maxdepth 1 -type f ! -name '*.md' ! -name logs.tgz -delete
ls "$OUT"
