#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 8): builds v4serve + the GPU tests (run_gpu.sh; V4_SKIP_BUILD=1
# skips that when the machine still has build-gpu/), then serves a V4-Flash-shaped dummy model
# (models/configs/v4-flash, --load-format dummy, layers cut to $V4_LAYERS, default 8 = 2 SWA +
# 3 CSA + 3 HCA) on the H200 with the CUDA backend. Three modes, one per call:
#
# (default) one PART of the 8K-in / 1K-out concurrency sweep: the levels in $V4_SWEEP (prefix
#   cache off, random token ids, ignore_eos, $V4_FACTOR x concurrency prompts per level),
#   driven by bench/serving/sweep_parts.py run: $OUT/sweep-part-$V4_PART.json is rewritten
#   after every level (rows, GPU busy/idle per level from the v4serve_gpu_* counters, the call's
#   command, commit, GPU and date); a level predicted to pass the call's deadline
#   ($V4_BUDGET_S seconds after the script starts, default 570) is skipped and listed. /metrics
#   is scraped before and after. Then every part found in bench/results/sweep-v4flash-${V4_LAYERS}l/
#   (earlier calls, committed) plus this one is merged into $OUT/sweep-merged.md + .png.
# V4_LONG=1: one request with a $V4_LONG_LEN-token prompt (default 1,000,000) over HTTP (TTFT,
#   decode tok/s, peak memory per pool from /metrics polled during it), then one request per
#   context in $V4_LONG_CONTEXTS (default 921600 131072 4096) whose prompt is a prefix of the
#   long one: decode tok/s at that context. The prefix cache is on with
#   --prefix-snapshot-interval $V4_LONG_SNAPSHOT (default 65536) so 921600 resumes at 917504
#   and 131072 at 65536 instead of recomputing. Writes $OUT/long-request.md/.json.
# V4_PREFIX=1: the prefix-cache comparison (see that branch below).
# V4_MERGE=1 (no GPU, runs anywhere): merge bench/results/sweep-v4flash-${V4_LAYERS}l/sweep-part-*.json
#   into bench/results/sweep-v4flash-${V4_LAYERS}l.md + .png.
#
# Estimates (one H200; bench/results/bench-v4flash-20l-after.md at 20 layers: prefill 3452 tok/s
# at 4K context, 755 tok/s at 1M; decode 8.45 ms/step at B=1, 189 ms at B=64; per-layer scaling,
# head not scaled; model in bench/serving/sweep_parts.py predict_level_s; ~60 s server start
# and stop per call on top; the build is NOT included — build in an earlier call or add it):
#   sweep, 1 x concurrency prompts of ~7.4K in / ~0.9K out per level, 8 layers:
#     decode as today:               levels 1..128 ~555 s, level 256 ~533 s  (total ~1090 s)
#     with B>=16 decode 3x faster:   levels 1..128 ~370 s, level 256 ~333 s  (total ~700 s)
#   -> with the faster decode: two calls, V4_SWEEP="1 2 4 8 16 32 64 128" V4_PART=a, then
#      V4_SWEEP=256 V4_PART=b (prefill is 2/3 of level 256: 256 x 7.4K tokens at ~8.5K tok/s).
#      Without it, use V4_LAYERS=6 (2 SWA + 2 CSA + 2 HCA): 1..128 ~420 s, 256 ~403 s (with it:
#      ~280 s + ~250 s). Either way the deadline guard skips what would not fit instead of
#      losing the call.
#   V4_LONG=1 at 8 layers: 1M prefill ~280 s (4096-token chunks cost 0.475 s + 1.35 us per
#      token of context: 20-layer numbers x 8/20, context part x 3/9 CSA+HCA layers), 921600 and
#      131072 from the prefix cache ~15 s, 4K ~1 s, decode 4 x 128 tokens ~2 s, + start: ~6 min.
#      Without a prefix hit the 921600 request would need ~240 s more: the deadline guard
#      records it as skipped rather than running over.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="V4_SWEEP='1 2 4 8 16 32 64 128' V4_PART=a bash scripts/device/serve_v4flash.sh",
#       carry=[".devdeps"], timeout_s=600)
#   copy $OUT/sweep-part-a.json to bench/results/sweep-v4flash-8l/, commit, next part, then
#   V4_MERGE=1 bash scripts/device/serve_v4flash.sh (here, no GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
T0=$(date +%s)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
LAYERS=${V4_LAYERS:-8}
SWEEP=${V4_SWEEP:-"1 2 4 8 16 32 64 128 256"}
PART=${V4_PART:-$(date -u +%H%M%S)}
FACTOR=${V4_FACTOR:-1}
IN_LEN=${V4_IN_LEN:-8192}
OUT_LEN=${V4_OUT_LEN:-1024}
BUDGET=${V4_BUDGET_S:-570}  # seconds this call may use from the script's start (run limit 600)
PARTS_DIR=bench/results/sweep-v4flash-${LAYERS}l
# The command line to record with the results (the V4_* settings that shaped it).
RECORD_CMD="$(env | grep -E '^V4_(LAYERS|SWEEP|PART|FACTOR|IN_LEN|OUT_LEN|BUDGET_S|LONG[A-Z_]*|CHUNK|MAX_RUNNING|MEM_FRACTION|SERVE_CONTEXT|SKIP_BUILD|FAST_DECODE)=' | sort | sed "s/=\(.*\)/='\1'/" | tr '\n' ' ')bash scripts/device/serve_v4flash.sh"
if [ "${V4_MERGE:-0}" = 1 ]; then  # no GPU: merge the committed parts
  ls "$PARTS_DIR"/sweep-part-*.json >/dev/null || { echo "no parts in $PARTS_DIR"; exit 2; }
  exec python3 bench/serving/sweep_parts.py merge "$PARTS_DIR"/sweep-part-*.json --layers "$LAYERS" \
    --out-md "bench/results/sweep-v4flash-${LAYERS}l.md" --out-png "bench/results/sweep-v4flash-${LAYERS}l.png"
fi
if [ "${V4_SKIP_BUILD:-0}" != 1 ]; then
  V4_TARGETS="v4serve test_cuda" V4_SKIP_BENCH=1 V4_GTEST_FILTER="${V4_GTEST_FILTER:-*}" \
    bash scripts/device/run_gpu.sh
  echo "build+tests rc=$? after $(( $(date +%s) - T0 ))s"
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
BIN=${V4SERVE_BIN:-build-gpu/v4serve}
[ -x "$BIN" ] || { echo "no v4serve binary"; exit 4; }
# V4_PORT=0: the kernel picks a free port; start_server reads it from the server's serving line.
REQ_PORT=${V4_PORT:-30111}
PORT=$REQ_PORT
if [ -n "${V4_TOKENIZER:-}" ]; then
  TOK=$V4_TOKENIZER
else
  TOK=/tmp/dsv3-tokenizer.json  # DeepSeek's tokenizer (V3 vocabulary, V4 uses the same merges)
  gunzip -c tests/data/text/deepseek-v3/tokenizer.json.gz >"$TOK"
fi
# V4_MODEL_ARGS replaces the model/device part (the CPU dry run in tests/e2e/test_long_context.py
# uses a tiny checkpoint on the CPU backend).
read -r -a MODEL_ARGS <<<"${V4_MODEL_ARGS:---model models/configs/v4-flash --load-format dummy --num-layers $LAYERS --device cuda --precision bf16 --mem-fraction ${V4_MEM_FRACTION:-0.90}}"
BASE_ARGS=(serve "${MODEL_ARGS[@]}" --tokenizer "$TOK" --port "$REQ_PORT"
      --max-running-requests "${V4_MAX_RUNNING:-256}" --chunked-prefill-size "${V4_CHUNK:-8192}"
      --context-length "${V4_SERVE_CONTEXT:-1048576}" --stats-interval 10 --no-access-log)
GPU_NAME=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
# start_server LOGNAME EXTRA_ARGS...: starts v4serve in the background (pid in $SRV), waits for
# /health; exits the script if the server dies.
start_server() {
  local log=$1; shift
  echo "server: $BIN ${BASE_ARGS[*]} $*" | tee -a "$OUT/serve-command.txt"
  "$BIN" "${BASE_ARGS[@]}" "$@" >"$OUT/$log" 2>&1 &
  SRV=$!
  PORT=$REQ_PORT
  for i in $(seq 1 240); do
    if [ "$PORT" = 0 ]; then
      PORT=$(sed -n "s/.*serving '.*) on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p" "$OUT/$log" | head -1)
      PORT=${PORT:-0}
    fi
    [ "$PORT" != 0 ] && curl -sf localhost:$PORT/health >/dev/null 2>&1 && break
    kill -0 $SRV 2>/dev/null || { echo "server died"; tail -30 "$OUT/$log"; exit 5; }
    sleep 1
  done
  echo "server up after ${i}s"; grep -iE "kv cache|kv budget|weights|layers|memory|prefix|cache pool" "$OUT/$log" | head -16
}
stop_server() {
  kill -TERM $SRV; wait $SRV
  echo "server exit: $?"
}
export V4_COMMIT="${V4_COMMIT:-$(cat .devdeps/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
if [ "${V4_PREFIX:-0}" = 1 ]; then
  P_LEN=${V4_PREFIX_LEN:-4096}; P_Q=${V4_PREFIX_Q_LEN:-128}; P_OUT=${V4_PREFIX_OUT:-64}
  P_CONC=${V4_PREFIX_CONC:-"1 8 32"}; P_FACTOR=${V4_PREFIX_FACTOR:-4}; P_NUM=${V4_PREFIX_NUM:-1}
  P_BYTES=${V4_PREFIX_BYTES:-8589934592}
  note="V4-Flash-shaped dummy weights, $LAYERS of 43 layers, bf16 precision mode, 1xH200, commit $V4_COMMIT"
  for mode in on off; do
    if [ $mode = on ]; then extra=(--prefix-cache-bytes "$P_BYTES"); else extra=(--disable-prefix-cache); fi
    start_server "server-prefix-$mode.log" "${extra[@]}"
    curl -s localhost:$PORT/metrics >"$OUT/metrics-prefix-$mode-before.txt"
    python3 bench/serving/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset shared-prefix \
      --prefix-len "$P_LEN" --num-prefixes "$P_NUM" --input-len "$P_Q" --output-len "$P_OUT" \
      --concurrency $P_CONC --num-prompts-factor "$P_FACTOR" --label "v4flash-prefix-$mode" \
      --note "$note, prefix cache $mode" --out "$OUT/prefix-$mode.md" --json-out "$OUT/prefix-$mode.json" \
      --timeout 1800 2>&1 | tail -8
    curl -s localhost:$PORT/metrics >"$OUT/metrics-prefix-$mode-after.txt"
    stop_server
  done
  python3 - "$OUT" "$P_LEN" "$P_Q" "$P_OUT" "$P_NUM" "$P_BYTES" "$LAYERS" "$V4_COMMIT" <<'PY'
import datetime as dt, json, os, sys
out, p_len, p_q, p_out, p_num, p_bytes, layers, commit = sys.argv[1:9]
on = json.load(open(f"{out}/prefix-on.json")); off = json.load(open(f"{out}/prefix-off.json"))
pct = lambda x: "-" if x != x else f"{100 * x:.1f}%"
rows = ["| conc | reqs (fail) on / off | TTFT mean on / off (ms) | TTFT p99 on / off (ms) | TTFT speed-up | "
        "TPOT mean on / off (ms) | tok/s/GPU on / off | prefix hit on (usage / metrics) |",
        "|---:|---|---|---|---:|---|---|---|"]
for a, b in zip(on, off):
    sp = b["ttft_mean_ms"] / a["ttft_mean_ms"] if a["ttft_mean_ms"] > 0 else float("nan")
    rows.append(f"| {a['concurrency']} | {a['requests']} ({a['failed']}) / {b['requests']} ({b['failed']}) | "
                f"{a['ttft_mean_ms']:.1f} / {b['ttft_mean_ms']:.1f} | {a['ttft_p99_ms']:.1f} / {b['ttft_p99_ms']:.1f} | "
                f"{sp:.2f}x | {a['tpot_mean_ms']:.2f} / {b['tpot_mean_ms']:.2f} | {a['tok_s_gpu']:.0f} / {b['tok_s_gpu']:.0f} | "
                f"{pct(a['hit_rate'])} / {pct(a.get('metrics_hit_rate', float('nan')))} |")
date = dt.date.today().isoformat()
md = "\n".join([f"# Prefix cache on vs off: shared-prefix serving, V4-Flash-shaped ({layers} layers), H200", "",
                f"- date: {date}; commit {commit}",
                f"- workload: {p_num} system prompt(s) of {p_len} random token ids + a distinct question of "
                f"[{int(0.8 * int(p_q))}, {p_q}] ids, {p_out} output tokens (ignore_eos, greedy, streaming)",
                f"- on: --prefix-cache-bytes {p_bytes}; off: --disable-prefix-cache; the rest as serve_v4flash.sh",
                "- per-level tables: prefix-on.md / prefix-off.md (bundled in serve-results.tgz)", ""] + rows) + "\n"
open(f"{out}/prefix-compare.md", "w").write(md)
os.makedirs("bench/results", exist_ok=True)
open(f"bench/results/prefix-{date}-v4flash.md", "w").write(md)
print(md)
PY
  (cd "$OUT" && tar czf serve-results.tgz prefix-on.* prefix-off.* metrics-prefix-*.txt server-prefix-*.log serve-command.txt 2>/dev/null \
    && rm -f prefix-on.* prefix-off.* metrics-prefix-*.txt server-prefix-*.log serve-command.txt)
  exit 0
fi
if [ "${V4_LONG:-0}" = 1 ]; then
  # One 1M-token request, then decode speed at shorter contexts (prefixes of it, prefix cache on).
  start_server server-long.log --prefix-cache-bytes "${V4_LONG_PREFIX_BYTES:-17179869184}" \
    --prefix-snapshot-interval "${V4_LONG_SNAPSHOT:-65536}"
  curl -s localhost:$PORT/metrics >"$OUT/metrics-long-before.txt"
  python3 bench/serving/long_request.py --base-url "http://127.0.0.1:$PORT" --prompt-len "${V4_LONG_LEN:-1000000}" \
    --decode-contexts ${V4_LONG_CONTEXTS:-921600 131072 4096} --max-tokens "${V4_LONG_OUT:-128}" \
    --deadline $(( T0 + BUDGET - 25 )) --commit "$V4_COMMIT" --gpu "$GPU_NAME" --command "$RECORD_CMD" \
    --server "$(tail -1 "$OUT/serve-command.txt" | sed 's/^server: //')" \
    --note "V4-Flash-shaped dummy weights, $LAYERS of 43 layers, bf16 precision mode" \
    --out-md "$OUT/long-request.md" --out-json "$OUT/long-request.json"
  echo "long_request rc=$?"
  curl -s localhost:$PORT/metrics >"$OUT/metrics-long-after.txt"
  stop_server; tail -5 "$OUT/server-long.log"
  (cd "$OUT" && tar czf long-results.tgz metrics-long-*.txt server-long.log serve-command.txt 2>/dev/null \
    && rm -f metrics-long-*.txt server-long.log serve-command.txt)
  exit 0
fi
# V4_SERVE_EXTRA: more serve flags for the sweep's server (e.g. --sync-outputs for the A/B of the
# GPU idle time between decode steps, docs/engine.md §Output thread).
read -r -a SERVE_EXTRA <<<"${V4_SERVE_EXTRA:-}"
start_server server.log --disable-prefix-cache "${SERVE_EXTRA[@]}"
curl -s localhost:$PORT/metrics >"$OUT/metrics-before.txt"
note="V4-Flash-shaped dummy weights (random; expert routing ~uniform), $LAYERS of 43 layers, FP8 blocks + MXFP4 experts, bf16 precision mode, 1xH200, commit $V4_COMMIT"
python3 bench/serving/sweep_parts.py run --base-url "http://127.0.0.1:$PORT" --levels $SWEEP --layers "$LAYERS" \
  --part "$PART" --out-dir "$OUT" --input-len "$IN_LEN" --output-len "$OUT_LEN" --factor "$FACTOR" \
  --note "$note" --command "$RECORD_CMD" --server-command-file "$OUT/serve-command.txt" \
  --deadline $(( T0 + BUDGET - 25 )) $([ "${V4_FAST_DECODE:-1}" = 1 ] && echo --fast-decode)
curl -s localhost:$PORT/metrics >"$OUT/metrics-after.txt"
stop_server; tail -5 "$OUT/server.log"
# This call's part + the parts of earlier calls committed under $PARTS_DIR -> one table + plot.
parts=("$OUT/sweep-part-$PART.json")
for f in "$PARTS_DIR"/sweep-part-*.json; do
  [ -e "$f" ] && [ "$(basename "$f")" != "sweep-part-$PART.json" ] && parts+=("$f")
done
python3 bench/serving/sweep_parts.py merge "${parts[@]}" --layers "$LAYERS" --out-md "$OUT/sweep-merged.md" \
  --out-png "$OUT/sweep-merged.png" | tail -40
# At most 8 files come back from the device: bundle everything but the part, the merged table and plot.
(cd "$OUT" && tar czf serve-results.tgz sweep-c*.json sweep-c*.md sweep-merged-rows.json metrics-*.txt server.log serve-command.txt 2>/dev/null \
  && rm -f sweep-c*.json sweep-c*.md sweep-merged-rows.json metrics-*.txt server.log serve-command.txt)
