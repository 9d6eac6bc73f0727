#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 7, one call, < 8 minutes): Nsight Compute reports of the
# three kernels that are far from their floors (docs/cuda.md §Missing):
#   attention_dec v4 / v5 / v6 / v2 at batch 1 (bench_kernels --profile-attention; kernel
#     attn_dec[235]_kernel, not the combine), Lightning TopK variant 37 (--profile-topk;
#     topk_kernel_v6), the indexer decode kernel over bf16 / fp8 keys (--profile-indexer;
#     indexer_decode_kernel; its pipelined form indexer_decode_pipe_kernel, variant 4).
# Builds bench_kernels in build-ncu with -lineinfo (run_gpu.sh: V4_BUILD_DIR, V4_CUDA_FLAGS_EXTRA;
# no tests), then per probe: one ncu run of one launch after warm-up launches (--launch-skip 5 of
# 20 launches of the probe's kernel), clocks left alone (--clock-control none: Durations compare
# with the event timings), sections SpeedOfLight, MemoryWorkloadAnalysis, ComputeWorkloadAnalysis,
# InstructionStats, WarpStateStats, SchedulerStats, Occupancy, LaunchStats, SourceCounters, the
# CUDA source imported into the report; then the report's details page, raw metrics (csv) and
# source pages (SASS and CUDA lines, csv), and a ~40-line summary (scripts/device/ncu_summary.py).
# Results under $OUT (≤ 8 files come back):
#   ncu-summary.txt  per probe: headline metrics (Duration, SM frequency, throughputs, IPC,
#                    eligible warps, warp cycles per issued instruction, registers, occupancy),
#                    the warp stall reasons (cycles per issued instruction), and the CUDA lines /
#                    SASS instructions with the most warp-stall samples
#   ncu-details.txt  every probe's full details page (one file)
#   logs.tgz         device.log, build.log, script log, per probe: .ncu-rep (when the archive stays
#                    under 15 MiB; open with ncu-ui), ncu stdout, details, raw / source csv
# Env: V4_SKIP_BUILD=1 (warm machine: reuse build-ncu), V4_PROBES (names below, default all),
#   V4_NCU_TIMEOUT (s per ncu run, default 75), V4_NCU_CLOCK (default none), V4_BUDGET_S (no
#   new probe starts after this many seconds of the script; default 420).
# From the developer machine:
#   bash scripts/device/pack_deps.sh; git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/ncu_issue7.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$OUT/ncu-work            # everything here goes into logs.tgz
mkdir -p "$W"
exec > >(tee -a "$W/ncu_issue7.log") 2>&1
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
B=${V4_NCU_BUILD_DIR:-build-ncu}  # V4_NCU_BUILD_DIR=build-gpu + V4_SKIP_BUILD=1: reuse issue7_run.sh's build
BK=$B/bench/bench_kernels

step "build bench_kernels (-lineinfo) in $B"
if [ "${V4_SKIP_BUILD:-0}" = 1 ] && [ -x $BK ]; then
  echo "skip build (warm machine)"
else
  V4_BUILD_DIR=$B V4_CUDA_FLAGS_EXTRA="-lineinfo" V4_TARGETS=bench_kernels V4_SKIP_BENCH=1 \
    V4_SKIP_TESTS=1 timeout 300 bash scripts/device/run_gpu.sh > /dev/null 2>&1
  echo "build rc=$?"
  grep -E "build FAILED|configure FAILED|error" "$OUT/device.log" | head -20
  mv -f "$OUT/device.log" "$OUT/build.log" "$W/" 2>/dev/null
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
if [ ! -x $BK ]; then step "no $BK: build failed (logs.tgz: build.log)"; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv || true

summary=$OUT/ncu-summary.txt
details_all=$OUT/ncu-details.txt
: > "$summary"; : > "$details_all"
{
  echo "# ncu probes (scripts/device/ncu_issue7.sh), commit $(cat .devdeps/commit 2>/dev/null || echo unknown), $(date -u +%FT%TZ)"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(ncu --version 2>/dev/null | tail -1)"
  echo "# one launch per probe after 5 warm-up launches of its kernel; --clock-control ${V4_NCU_CLOCK:-none};"
  echo "# inputs cold as in the benches (ncu also flushes the caches before the profiled launch)"
  echo
} >> "$summary"

ncu_ok=0
if command -v ncu > /dev/null && [ -x $BK ]; then
  ncu_ok=1
  help=$(ncu --help 2>&1)
  has_opt() { grep -q -- "$1" <<< "$help"; }
  imp=(); has_opt "--import-source" && imp=(--import-source yes)
  pdet=(); has_opt "--print-details" && pdet=(--print-details all)
  psrc=1; has_opt "--print-source" || psrc=0
  sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
            --section InstructionStats --section WarpStateStats --section SchedulerStats
            --section Occupancy --section LaunchStats --section SourceCounters)
fi

# probe NAME KERNEL_REGEX BENCH_ARGS...
probe() {
  local name=$1 kre=$2; shift 2
  [ -n "${V4_PROBES:-}" ] && [[ " $V4_PROBES " != *" $name "* ]] && return 0
  if [ $(( $(date +%s) - t0 )) -gt "${V4_BUDGET_S:-420}" ]; then  # keep the call under 8 minutes
    step "probe $name skipped: over the ${V4_BUDGET_S:-420} s budget"
    echo "### $name: skipped (time budget)" >> "$summary"
    return 0
  fi
  step "probe $name: bench_kernels $* (kernel regex $kre)"
  local rep=$W/$name
  timeout "${V4_NCU_TIMEOUT:-75}" ncu --kernel-name "regex:$kre" --launch-skip 5 --launch-count 1 \
    --clock-control "${V4_NCU_CLOCK:-none}" "${sections[@]}" "${imp[@]}" -f -o "$rep" \
    $BK --launches 20 "$@" > "$rep.ncu.log" 2>&1
  local rc=$?
  echo "ncu rc=$rc"; grep -E "==PROF==|==ERROR==|==WARNING==|done" "$rep.ncu.log" | head -8
  if [ ! -f "$rep.ncu-rep" ]; then
    { echo "### $name: no report (ncu rc=$rc)"; grep -E "==ERROR==|error|Error" "$rep.ncu.log" | head -5; echo; } >> "$summary"
    return 0
  fi
  timeout 60 ncu --import "$rep.ncu-rep" --page details "${pdet[@]}" > "$rep.details.txt" 2>&1
  timeout 60 ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
  if [ $psrc = 1 ]; then
    timeout 60 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    timeout 60 ncu --import "$rep.ncu-rep" --page source --csv --print-source cuda > "$rep.cuda.csv" 2>&1
  else
    timeout 60 ncu --import "$rep.ncu-rep" --page source --csv > "$rep.sass.csv" 2>&1
    : > "$rep.cuda.csv"
  fi
  { echo "######## $name: bench_kernels --launches 20 $*"; cat "$rep.details.txt"; echo; } >> "$details_all"
  { python3 scripts/device/ncu_summary.py "$name: bench_kernels --launches 20 $*" "$rep.details.txt" "$rep.raw.csv" "$rep.sass.csv" "$rep.cuda.csv"
  } >> "$summary" 2>&1
  grep -E "Duration|Warp Cycles Per Issued" "$rep.details.txt" | head -3
}

if [ $ncu_ok = 1 ]; then
  # attention_dec at batch 1, bf16 pool: CSA 640 keys = 128 SWA + 512 top-k (20 tiles),
  # HCA 1M = 128 + 8,192 compressed (260 tiles)
  A='attn_dec[0-9]?_kernel'
  probe attn-v4-csa640-s1 "$A" --profile-attention 4 640 1 bf16
  probe attn-v4-csa640-s20 "$A" --profile-attention 4 640 20 bf16
  probe attn-v5-hca8320-s33 "$A" --profile-attention 5 8320 33 bf16
  probe attn-v6-hca8320-s33 "$A" --profile-attention 6 8320 33 bf16
  probe attn-v2-csa640-s20 "$A" --profile-attention 2 640 20 bf16
  probe attn-v7-csa640-s1 "$A" --profile-attention 7 640 1 bf16
  probe attn-v7-hca8320-s33 "$A" --profile-attention 7 8320 33 bf16
  # Lightning TopK v6 (variant 37) top-512 at batch 1
  probe topk37-262144 topk_kernel --profile-topk 37 262144
  probe topk37-8192 topk_kernel --profile-topk 37 8192
  # indexer decode kernel (auto), batch 1, 230,400 keys (900K context)
  probe idx-bf16-230400 indexer_decode_kernel --profile-indexer bf16 230400
  probe idx-fp8-230400 indexer_decode_kernel --profile-indexer fp8 230400
  # the e4m3 tensor-core kernel (variant 20 = auto for fp8 keys) and its key-prefetch forms 22 / 23
  probe idx-fp8-v20-230400 indexer_decode_kernel --profile-indexer fp8 230400 20
  probe idx-fp8-v22-230400 indexer_decode_kernel --profile-indexer fp8 230400 22
  probe idx-fp8-v23-230400 indexer_decode_kernel --profile-indexer fp8 230400 23
  # the f16 tensor-core forms (24 / 25 / 26)
  probe idx-fp8-v24-230400 indexer_decode_kernel --profile-indexer fp8 230400 24
  probe idx-fp8-v25-230400 indexer_decode_kernel --profile-indexer fp8 230400 25
  probe idx-fp8-v26-230400 indexer_decode_kernel --profile-indexer fp8 230400 26
  # pipelined decode kernel (indexer_scores_tc variant 4: cp.async ring of 3 chunk slots per warp)
  probe idx-pipe-bf16-230400 indexer_decode_pipe_kernel --profile-indexer bf16 230400 4
  probe idx-pipe-fp8-230400 indexer_decode_pipe_kernel --profile-indexer fp8 230400 4
  # warpgroup-MMA kernel, bf16 keys: heads on M (variant 8) and keys on M (variant 10)
  probe idx-wg8-bf16-230400 indexer_decode_wg_kernel --profile-indexer bf16 230400 8
  probe idx-wg10-bf16-230400 indexer_decode_wg_kernel --profile-indexer bf16 230400 10
  if ! grep -q "^### " "$summary"; then
    echo "no probe produced a report: see logs.tgz (ncu-work/*.ncu.log)" >> "$summary"
  fi
else
  echo "ncu missing or no bench_kernels: no probes" | tee -a "$summary"
fi
# Resource usage of the probed kernels (registers, shared memory, spills), also without counters.
if command -v cuobjdump > /dev/null && [ -x $BK ]; then
  cuobjdump --dump-resource-usage $BK 2>/dev/null |
    grep -A1 -E "attn_dec[0-9]?_kernel|topk_kernel_v6|indexer_decode_kernel" > "$W/resource-usage.txt"
  { echo "## resource usage (cuobjdump --dump-resource-usage; Function line, then REG/SHARED/STACK)"
    grep -E "REG|Function" "$W/resource-usage.txt" | sed 's/^[[:space:]]*//' | cut -c1-200 | head -40
  } >> "$summary"
fi

step "bundle"
cd "$OUT" || exit 1
tar czf /tmp/ncu-logs.tgz ncu-work && mv /tmp/ncu-logs.tgz logs.tgz
if [ "$(stat -c %s logs.tgz)" -gt $((15 * 1024 * 1024)) ]; then
  echo "logs.tgz over 15 MiB with the .ncu-rep reports: leaving them out"
  tar czf /tmp/ncu-logs.tgz --exclude='*.ncu-rep' ncu-work && mv /tmp/ncu-logs.tgz logs.tgz
fi
if [ "$(stat -c %s ncu-details.txt)" -gt $((15 * 1024 * 1024)) ]; then
  head -c $((15 * 1024 * 1024)) ncu-details.txt > /tmp/d.txt && mv /tmp/d.txt ncu-details.txt
fi
rm -rf ncu-work
find . -maxdepth 1 -type f ! -name ncu-summary.txt ! -name ncu-details.txt ! -name logs.tgz -delete
ls -la "$OUT"
step "done"
