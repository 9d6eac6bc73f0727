#!/usr/bin/env bash
# Runs ON the lent GPU machine: builds v4serve with the CUDA backend (via run_gpu.sh, golden GPU
# tests included), then checks that the model served on the GPU gives the CPU backend's greedy
# tokens: (1) `generate --device cuda` vs `--device cpu` on every golden fixture prompt;
# (2) `serve --device cuda` with models/default answering the embedded model's reference prompts
# over HTTP (/v1/completions with token ids) vs `generate --device cpu`.
# From the developer machine:
#   git rev-parse --short HEAD > .devdeps/commit
#   run(command="bash scripts/device/gpu_serve_check.sh", carry=[".devdeps"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(pwd)/out-local}
V4_TARGETS="v4serve test_cuda" V4_SKIP_BENCH=1 V4_GTEST_FILTER="${V4_GTEST_FILTER:-CudaGolden*}" bash scripts/device/run_gpu.sh
build_rc=$?
D=/opt/v4deps; L=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$L:$L/openblas-pthread:${LD_LIBRARY_PATH:-}"
BIN=build-gpu/v4serve
[ -x $BIN ] || { echo "no v4serve binary (build rc $build_rc)"; exit 4; }
python3 - "$BIN" "$OUT/gpu-serve-check.md" <<'PY'
import json, os, socket, subprocess, sys, time, urllib.request
import numpy as np
from safetensors.numpy import load_file
binary, out = sys.argv[1], sys.argv[2]
rows, fails = [], 0

def generate(model, ids, n, device):
    r = subprocess.run([binary, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
                        "--max-new-tokens", str(n), "--temperature", "0", "--device", device] + (["--precision", "fp32"] if device == "cuda" else []),
                       capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("tokens:"):
            return [int(t) for t in line.split(":", 1)[1].split(",") if t.strip()]
    raise RuntimeError(f"generate {device} failed: {r.stderr[-400:]}")

for name in sorted(os.listdir("tests/fixtures")):
    d = os.path.join("tests/fixtures", name)
    if not os.path.exists(os.path.join(d, "golden.safetensors")):
        continue
    g = load_file(os.path.join(d, "golden.safetensors"))
    ids = [int(x) for x in g["prompt_ids"]]
    n = len(g["tokens"])
    cpu, gpu = generate(d, ids, n, "cpu"), generate(d, ids, n, "cuda")
    ok = cpu == gpu == [int(x) for x in g["tokens"]]
    fails += not ok
    rows.append(f"| generate | {name} | {len(ids)} | {n} | {'identical' if ok else 'DIFFERENT'} |")

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
srv = subprocess.Popen([binary, "serve", "--model", "models/default", "--port", str(port), "--device", "cuda", "--precision", "fp32"],
                       stdout=open(os.path.join(os.path.dirname(out), "gpu-serve.log"), "w"), stderr=subprocess.STDOUT)
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
        except Exception:
            time.sleep(0.2)
    gens = json.load(open("tests/data/model/generations.json"))
    gens = gens if isinstance(gens, list) else gens.get("generations", gens.get("entries", []))
    for e in gens:
        ids, n = e["ids"], 32
        body = json.dumps({"model": "default", "prompt": ids, "max_tokens": n, "temperature": 0,
                           "ignore_eos": True, "logprobs": 1}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        j = json.load(urllib.request.urlopen(req, timeout=120))
        text_gpu = j["choices"][0]["text"]
        cpu = generate("models/default", ids, n, "cpu")
        det = subprocess.run([binary, "detokenize", "--tokenizer", "models/default", "--ids",
                              ",".join(map(str, cpu))], capture_output=True, text=True).stdout
        text_cpu = json.loads(det)["text"] if det.strip().startswith("{") else det
        ok = text_gpu == text_cpu
        fails += not ok
        rows.append(f"| HTTP serve --device cuda | {e.get('prompt', '')[:30]!r} | {len(ids)} | {n} | {'identical' if ok else 'DIFFERENT'} |")
finally:
    srv.terminate(); srv.wait(timeout=30)
with open(out, "w") as f:
    f.write("# GPU (CUDA fp32 backend) vs CPU backend: greedy tokens\n\n")
    f.write(f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit: {os.environ.get('V4_COMMIT', open('.devdeps/commit').read().strip())}\n")
    try:
        gpu = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version', '--format=csv,noheader'],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = "none (nvidia-smi missing)"
    f.write(f"- GPU: {gpu}\n")
    f.write("- command: `bash scripts/device/gpu_serve_check.sh` (device tool, carry .devdeps)\n\n")
    f.write("| path | prompt | prompt tokens | new tokens | GPU vs CPU (and golden for fixtures) |\n|---|---|---:|---:|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(out).read())
sys.exit(1 if fails else 0)
PY
rc=$?
echo "gpu serve check rc=$rc (build/tests rc=$build_rc)"
exit $(( rc != 0 ? rc : build_rc ))
