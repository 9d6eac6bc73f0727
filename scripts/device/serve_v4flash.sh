#!/usr/bin/env bash
# Runs ON the lent GPU machine (issue 8): builds v4serve + the GPU tests (run_gpu.sh), then serves a
# V4-Flash-shaped dummy model (models/configs/v4-flash, --load-format dummy, layers cut to
# $V4_LAYERS) on the H200 with the CUDA backend and measures it with bench/serving/bench_serving.py:
#   1. /metrics scraped before and after everything;
#   2. the 8K-in / 1K-out concurrency sweep ($V4_SWEEP, prefix cache off, random token ids,
#      ignore_eos, $V4_FACTOR x concurrency prompts per level) -> sweep.md + sweep.json;
#   3. GPU busy/idle between steps from the server's v4serve_gpu_* counters per sweep level;
#   4. optional ($V4_LONG=1): one request with a $V4_LONG_LEN-token prompt (TTFT, decode tok/s,
#      pool use).
# With V4_PREFIX=1 it runs the prefix-cache comparison INSTEAD of steps 2-4: the shared-prefix
# workload (bench_serving.py --dataset shared-prefix: $V4_PREFIX_NUM system prompt(s) of
# $V4_PREFIX_LEN token ids + distinct questions of up to $V4_PREFIX_Q_LEN ids, $V4_PREFIX_OUT
# output tokens, concurrency $V4_PREFIX_CONC, $V4_PREFIX_FACTOR x concurrency prompts per level)
# once against a server with the prefix cache on (--prefix-cache-bytes $V4_PREFIX_BYTES) and once
# with --disable-prefix-cache, then writes the comparison (TTFT, TPOT, throughput, hit rate from
# usage and /metrics) to $OUT/prefix-compare.md and bench/results/prefix-<date>-v4flash.md.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/serve_v4flash.sh", carry=[".devdeps"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT=${OUT:-$root/out-local}
mkdir -p "$OUT"
LAYERS=${V4_LAYERS:-20}
SWEEP=${V4_SWEEP:-"1 2 4 8 16 32 64 128 256"}
FACTOR=${V4_FACTOR:-1}
IN_LEN=${V4_IN_LEN:-8192}
OUT_LEN=${V4_OUT_LEN:-1024}
if [ "${V4_SKIP_BUILD:-0}" != 1 ]; then
  V4_TARGETS="v4serve test_cuda" V4_SKIP_BENCH=1 V4_GTEST_FILTER="${V4_GTEST_FILTER:-*}" \
    bash scripts/device/run_gpu.sh
  echo "build+tests rc=$?"
fi
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
BIN=build-gpu/v4serve
[ -x $BIN ] || { echo "no v4serve binary"; exit 4; }
PORT=30111
TOK=/tmp/dsv3-tokenizer.json  # DeepSeek's tokenizer (V3 vocabulary, V4 uses the same merges)
gunzip -c tests/data/text/deepseek-v3/tokenizer.json.gz >"$TOK"
BASE_ARGS=(serve --model models/configs/v4-flash --load-format dummy --num-layers "$LAYERS" --device cuda
      --precision bf16 --mem-fraction "${V4_MEM_FRACTION:-0.90}"
      --tokenizer "$TOK" --port $PORT
      --max-running-requests "${V4_MAX_RUNNING:-256}" --chunked-prefill-size "${V4_CHUNK:-8192}"
      --context-length "${V4_SERVE_CONTEXT:-1048576}" --stats-interval 10 --no-access-log)
# start_server LOGNAME EXTRA_ARGS...: starts v4serve in the background (pid in $SRV), waits for
# /health; exits the script if the server dies.
start_server() {
  local log=$1; shift
  echo "server: $BIN ${BASE_ARGS[*]} $*" | tee -a "$OUT/serve-command.txt"
  $BIN "${BASE_ARGS[@]}" "$@" >"$OUT/$log" 2>&1 &
  SRV=$!
  for i in $(seq 1 240); do
    curl -sf localhost:$PORT/health >/dev/null 2>&1 && break
    kill -0 $SRV 2>/dev/null || { echo "server died"; tail -30 "$OUT/$log"; exit 5; }
    sleep 1
  done
  echo "server up after ${i}s"; grep -iE "kv cache|weights|layers|memory|prefix" "$OUT/$log" | head -14
}
stop_server() {
  kill -TERM $SRV; wait $SRV
  echo "server exit: $?"
}
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
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
start_server server.log --disable-prefix-cache
curl -s localhost:$PORT/metrics >"$OUT/metrics-before.txt"
export V4_COMMIT="$(cat .devdeps/commit 2>/dev/null || echo unknown)"
note="V4-Flash-shaped dummy weights (random; expert routing ~uniform), $LAYERS of 43 layers, FP8 blocks + MXFP4 experts, bf16 precision mode, 1xH200, commit $V4_COMMIT"
python3 - "$PORT" "$OUT" "$SWEEP" "$FACTOR" "$IN_LEN" "$OUT_LEN" "$note" <<'PY'
import json, subprocess, sys, time, urllib.request
port, out, sweep, factor, in_len, out_len, note = sys.argv[1:8]
def metrics():
    txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    m = {}
    for line in txt.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            m[k] = float(v)
        except ValueError:
            pass
    return m
rows_all, gaps = [], []
for c in sweep.split():
    before = metrics(); t0 = time.time()
    r = subprocess.run([sys.executable, "bench/serving/bench_serving.py", "--base-url", f"http://127.0.0.1:{port}",
                        "--input-len", in_len, "--output-len", out_len, "--concurrency", c,
                        "--num-prompts-factor", factor, "--label", f"v4flash-c{c}", "--note", note,
                        "--out", f"{out}/sweep-c{c}.md", "--json-out", f"{out}/sweep-c{c}.json",
                        "--timeout", "1800"], capture_output=True, text=True)
    print(r.stderr[-600:], flush=True)
    after = metrics(); wall = time.time() - t0
    try:
        rows_all += json.load(open(f"{out}/sweep-c{c}.json"))
    except Exception as e:
        print("no rows for", c, e)
    d = lambda k: after.get(k, 0) - before.get(k, 0)
    steps = d("v4serve_gpu_steps_total")
    gaps.append((int(c), steps, d("v4serve_gpu_busy_seconds_total"), d("v4serve_gpu_idle_seconds_total"),
                 d("v4serve_gpu_decode_steps_total"), d("v4serve_gpu_decode_idle_seconds_total"), wall))
json.dump(rows_all, open(f"{out}/sweep.json", "w"), indent=1)
with open(f"{out}/gpu-idle.md", "w") as f:
    f.write("| concurrency | steps | GPU busy (s) | GPU idle between steps (s) | idle / step (us) | decode steps | idle / decode step (us) | wall (s) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for c, n, busy, idle, dn, didle, wall in gaps:
        f.write(f"| {c} | {n:.0f} | {busy:.2f} | {idle:.2f} | {1e6*idle/max(n,1):.0f} | {dn:.0f} | {1e6*didle/max(dn,1):.0f} | {wall:.0f} |\n")
print(open(f"{out}/gpu-idle.md").read())
PY
if [ "${V4_LONG:-0}" = 1 ]; then
  python3 - "$PORT" "$OUT" "${V4_LONG_LEN:-1000000}" <<'PY'
import json, random, sys, time, urllib.request
port, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(7)
ids = [rng.randrange(1000, 120000) for _ in range(n)]
body = json.dumps({"model": "x", "prompt": ids, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                   "stream": True}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
t0 = time.time(); first = None; times = []
with urllib.request.urlopen(req, timeout=3600) as r:
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        now = time.time()
        if first is None:
            first = now
        times.append(now)
total = time.time() - t0
ttft = (first - t0) if first else float("nan")
dec = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
pools = [l for l in m.splitlines() if "pool" in l and not l.startswith("#")]
with open(f"{out}/long-request.md", "w") as f:
    f.write(f"# One request, {n}-token prompt, 64 output tokens\n\n- TTFT: {ttft:.1f} s\n- decode: {dec:.1f} tok/s ({len(times)} chunks)\n- total: {total:.1f} s\n\nPools after the request (from /metrics):\n\n```\n" + "\n".join(pools) + "\n```\n")
print(open(f"{out}/long-request.md").read())
PY
fi
curl -s localhost:$PORT/metrics >"$OUT/metrics-after.txt"
stop_server; tail -5 "$OUT/server.log"
# At most 8 files come back from the device: bundle everything but the summary tables.
(cd "$OUT" && tar czf serve-results.tgz sweep*.json sweep-c*.md metrics-*.txt server.log serve-command.txt 2>/dev/null \
  && rm -f sweep-c*.json sweep-c*.md metrics-*.txt server.log serve-command.txt)
