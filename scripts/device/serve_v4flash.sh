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
ARGS=(serve --model models/configs/v4-flash --load-format dummy --num-layers "$LAYERS" --device cuda
      --precision bf16 --mem-fraction "${V4_MEM_FRACTION:-0.90}" --disable-prefix-cache
      --tokenizer "$TOK" --port $PORT
      --max-running-requests "${V4_MAX_RUNNING:-256}" --chunked-prefill-size "${V4_CHUNK:-8192}"
      --context-length "${V4_SERVE_CONTEXT:-1048576}" --stats-interval 10 --no-access-log)
echo "server: $BIN ${ARGS[*]}" | tee "$OUT/serve-command.txt"
$BIN "${ARGS[@]}" >"$OUT/server.log" 2>&1 &
SRV=$!
for i in $(seq 1 240); do
  curl -sf localhost:$PORT/health >/dev/null 2>&1 && break
  kill -0 $SRV 2>/dev/null || { echo "server died"; tail -30 "$OUT/server.log"; exit 5; }
  sleep 1
done
echo "server up after ${i}s"; grep -iE "kv cache|weights|layers|memory" "$OUT/server.log" | head -12
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
kill -TERM $SRV; wait $SRV
echo "server exit: $?"; tail -5 "$OUT/server.log"
# At most 8 files come back from the device: bundle everything but the summary tables.
(cd "$OUT" && tar czf serve-results.tgz sweep*.json sweep-c*.md metrics-*.txt server.log serve-command.txt 2>/dev/null \
  && rm -f sweep-c*.json sweep-c*.md metrics-*.txt server.log serve-command.txt)
