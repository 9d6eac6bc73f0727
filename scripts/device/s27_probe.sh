#!/usr/bin/env bash
# Runs ON the lent GPU machine (session 27, one call, < 10 minutes):
#   1. builds v4serve (run_gpu.sh, no tests unless V4_TESTS=1: then test_cuda too, all GPU op tests);
#   2. ncu of every kernel of one decode step, batch 1, 4 layers (2 SWA, 1 CSA, 1 HCA), at 4K and
#      900K context (bf16 KV + fp8 indexer keys, as served) -> $OUT/ncu-decode-kernels.md
#      (kernels serialised under ncu: per-kernel device time, no overlap, no launch gaps);
#   3. the engine's output thread on the GPU (V4_AB=1, default): two servers (6 layers, dummy
#      V4-Flash weights), default and --sync-outputs, each driven at concurrency $V4_AB_CONC
#      (default "64 256"; one wave of C requests of ~$V4_AB_IN prompt / $V4_AB_OUT output tokens,
#      ignore_eos, streaming) with /metrics scraped around every level -> $OUT/serve-outputs-ab.md
#      (TPOT, throughput, GPU idle time per decode step from v4serve_gpu_decode_idle_seconds_total
#      / v4serve_gpu_decode_steps_total). V4_AB_MODES="thread" runs the default server only.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/s27_probe.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT/logs"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s]"; }
export NCCL_NVLS_ENABLE=0 PATH="/usr/local/cuda/bin:$PATH"
COMMIT=$(cat .devdeps-bin/commit 2>/dev/null || cat .devdeps/commit 2>/dev/null || echo unknown)
targets="v4serve"; skip_tests=1
[ "${V4_TESTS:-0}" = 1 ] && { targets="v4serve test_cuda"; skip_tests=0; }
if [ "${V4_SKIP_BUILD:-0}" != 1 ] || [ ! -x build-gpu/v4serve ]; then
  OUT=$OUT/logs V4_TARGETS="$targets" V4_SKIP_BENCH=1 V4_SKIP_TESTS=$skip_tests \
    bash scripts/device/run_gpu.sh > /dev/null 2>&1
  echo "$(el) build rc=$?"; grep -E "^\[  FAILED|^\[  PASSED|build FAILED|error:" "$OUT/logs/device.log" | head -30
  [ -f "$OUT/logs/cuda-op-tests.log" ] && cp "$OUT/logs/cuda-op-tests.log" "$OUT/cuda-op-tests.log"
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
[ -d build-gpu/lib ] && L=$root/build-gpu/lib  # prebuilt binaries (s28_run.sh) bring their libraries
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
[ -x build-gpu/v4serve ] || { echo "no build-gpu/v4serve"; exit 3; }
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)

if [ "${V4_NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  f="$OUT/ncu-decode-kernels.md"
  { echo "# Kernels of one decode step at 4K and 900K: V4-Flash shape, 4 layers, batch 1, ncu"; echo
    echo "- commit: $COMMIT, date: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU: $GPU"
    echo "- command (per context C): \`V4_BENCH_PROFILER=decode ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy --num-layers 4 --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 --index-cache-dtype fp8 --batch 1 --context C --steps 1 --warmup 2 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 256\` (script: scripts/device/s27_probe.sh)"
    echo "- kernels run serialised under ncu: the totals are kernel time without overlap of the side streams and without launch gaps"
    echo; } > "$f"
  for ctx in 4K 900K; do
    V4_BENCH_PROFILER=decode timeout 150 ncu --profile-from-start off --clock-control none \
      --cache-control none -f -o "$OUT/logs/dec-$ctx" \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
      build-gpu/v4serve bench --model models/configs/v4-flash --load-format dummy --num-layers 4 \
      --device cuda --precision bf16 --mem-fraction 0.9 --kv-cache-dtype bf16 --index-cache-dtype fp8 \
      --batch 1 --context "$ctx" --steps 1 --warmup 2 --prefill-steps 1 --prefill-warmup 0 --prefill-chunk 256 \
      --out "$OUT/logs/dec-$ctx-bench.md" > "$OUT/logs/ncu-dec-$ctx.log" 2>&1
    echo "$(el) ncu decode $ctx rc=$?"
    ncu --import "$OUT/logs/dec-$ctx.ncu-rep" --page raw --csv > "$OUT/logs/dec-$ctx.csv" 2>> "$OUT/logs/ncu-dec-$ctx.log"
    python3 scripts/device/kernel_table.py "decode step (batch 1, context $ctx)" "$OUT/logs/dec-$ctx.csv" >> "$f"
    rm -f "$OUT/logs/dec-$ctx.ncu-rep"
  done
  grep -A30 "^| kernel | launches" "$f" | head -70
fi

if [ "${V4_AB:-1}" = 1 ]; then
  TOK=/tmp/dsv3-tokenizer.json
  gunzip -c tests/data/text/deepseek-v3/tokenizer.json.gz > "$TOK"
  f="$OUT/serve-outputs-ab.md"
  IN=${V4_AB_IN:-1024}; OUTL=${V4_AB_OUT:-256}; CONC=${V4_AB_CONC:-"64 256"}
  { echo "# Engine output thread on the H200: default vs --sync-outputs"; echo
    echo "- commit: $COMMIT, date: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU: $GPU"
    echo "- server: \`build-gpu/v4serve serve --model models/configs/v4-flash --load-format dummy --num-layers 6 --device cuda --precision bf16 --mem-fraction 0.9 --tokenizer <DeepSeek tokenizer> --port 0 --max-running-requests 256 --chunked-prefill-size 8192 --no-access-log [--sync-outputs]\` (2 SWA + 2 CSA + 2 HCA layers of V4-Flash, dummy weights)"
    echo "- load per level C: \`bench/serving/bench_serving.py --dataset random-ids --input-len $IN --output-len $OUTL --concurrency C --num-prompts C\` (one wave of C streaming requests, lengths uniform in [0.8·L, L], ignore_eos); /metrics scraped before and after the level"
    echo "- idle µs / decode step = Δ v4serve_gpu_decode_idle_seconds_total / Δ v4serve_gpu_decode_steps_total (device idle time before a decode step that followed a decode step: the host's time between steps)"
    echo "- script: \`bash scripts/device/s27_probe.sh\` (V4_NCU=0 for this part alone)"
    echo
    echo "- host prep µs / decode step = Δ v4serve_gpu_decode_host_prep_seconds_total / Δ steps (the part of the idle time inside the model's forward; since session 27's metric, blank before)"
    echo
    echo "- engine phases µs / step = Δ v4serve_engine_step_host_seconds_total{phase} / Δ v4serve_engine_steps_total (the scheduler thread's wall time: schedule, batch build, forward, post, between steps; since session 28)"
    echo
    echo "| outputs | concurrency | decode steps | idle µs / decode step | host prep µs / decode step | mean TPOT ms | output tok/s | total tok/s | engine µs / step: schedule / batch / forward / post / between |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"; } > "$f"
  metric() { grep -E "^$1 " "$2" | awk '{print $2}'; }
  for mode in ${V4_AB_MODES:-thread sync}; do
    extra=(); [ $mode = sync ] && extra=(--sync-outputs)
    log="$OUT/logs/serve-$mode.log"
    build-gpu/v4serve serve --model models/configs/v4-flash --load-format dummy --num-layers 6 \
      --device cuda --precision bf16 --mem-fraction 0.9 --tokenizer "$TOK" --port 0 \
      --max-running-requests 256 --chunked-prefill-size 8192 --no-access-log "${extra[@]}" > "$log" 2>&1 &
    SRV=$!; PORT=0
    for i in $(seq 1 180); do
      [ "$PORT" = 0 ] && PORT=$(sed -n "s/.*serving '.*) on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p" "$log" | head -1)
      PORT=${PORT:-0}
      [ "$PORT" != 0 ] && curl -sf localhost:$PORT/health > /dev/null 2>&1 && break
      kill -0 $SRV 2> /dev/null || { echo "server ($mode) died"; tail -20 "$log"; break; }
      sleep 1
    done
    echo "$(el) server $mode up on $PORT after ${i}s"
    for c in $CONC; do
      curl -s localhost:$PORT/metrics > /tmp/m0.txt
      PYTHONUNBUFFERED=1 timeout 200 python3 bench/serving/bench_serving.py --base-url "http://127.0.0.1:$PORT" \
        --dataset random-ids --input-len "$IN" --output-len "$OUTL" --concurrency "$c" --num-prompts "$c" \
        --warmup-output-len 4 --label "ab-$mode-$c" --out "$OUT/logs/ab-$mode-$c.md" \
        --json-out "$OUT/logs/ab-$mode-$c.json" > "$OUT/logs/ab-$mode-$c.log" 2>&1
      echo "$(el) $mode C=$c rc=$?"
      curl -s localhost:$PORT/metrics > /tmp/m1.txt
      python3 - "$mode" "$c" "$OUT/logs/ab-$mode-$c.json" /tmp/m0.txt /tmp/m1.txt >> "$f" <<'PY'
import json, sys
mode, c, js, m0, m1 = sys.argv[1:6]
def m(path):
    d = {}
    for line in open(path):
        if line and not line.startswith('#'):
            p = line.split()
            if len(p) == 2:
                try: d[p[0]] = float(p[1])
                except ValueError: pass
    return d
a, b = m(m0), m(m1)
steps = b.get('v4serve_gpu_decode_steps_total', 0) - a.get('v4serve_gpu_decode_steps_total', 0)
idle = b.get('v4serve_gpu_decode_idle_seconds_total', 0) - a.get('v4serve_gpu_decode_idle_seconds_total', 0)
try:
    r = json.load(open(js))
    lv = r[0]
    tpot, otps, ttps = lv['tpot_mean_ms'], lv['out_tok_s'], lv['total_tok_s']
    if lv.get('failed'): print(f"<!-- {mode} C={c}: {lv['failed']} failed: {lv.get('errors')} -->")
except Exception as e:  # noqa: BLE001 — the table says what failed
    tpot = otps = ttps = float('nan'); print(f"<!-- {js}: {e} -->")
per = 1e6 * idle / steps if steps > 0 else float('nan')
hp = b.get('v4serve_gpu_decode_host_prep_seconds_total')
prep = f"{1e6 * (hp - a.get('v4serve_gpu_decode_host_prep_seconds_total', 0)) / steps:.0f}" if hp is not None and steps > 0 else ""
hg = b.get('v4serve_gpu_decode_host_gap_seconds_total')
if hg is not None and steps > 0:  # the host side of the idle time (since session 28)
    prep += f" (host gap {1e6 * (hg - a.get('v4serve_gpu_decode_host_gap_seconds_total', 0)) / steps:.0f})"
es = b.get('v4serve_engine_steps_total', 0) - a.get('v4serve_engine_steps_total', 0)
ph = []
for k in ('schedule', 'batch', 'forward', 'post', 'between'):
    key = f'v4serve_engine_step_host_seconds_total{{phase="{k}"}}'
    ph.append(f"{1e6 * (b[key] - a.get(key, 0)) / es:.0f}" if key in b and es > 0 else "")
print(f"| {'output thread (default)' if mode == 'thread' else '--sync-outputs'} | {c} | {int(steps)} | {per:.0f} | {prep} | {tpot:.2f} | {otps:.0f} | {ttps:.0f} | {' / '.join(ph)} |")
PY
      tail -1 "$f"
    done
    kill -TERM $SRV; wait $SRV; echo "$(el) server $mode exit $?"
  done
  cp "$OUT/logs/ab-thread-64.json" "$OUT/logs/example-level.json" 2> /dev/null
fi
cd "$OUT" && tar czf /tmp/s27-logs.tgz logs && rm -rf logs && mv /tmp/s27-logs.tgz logs.tgz
ls -la "$OUT"
