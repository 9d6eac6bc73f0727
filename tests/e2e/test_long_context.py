"""The 1,000,000-token request path (issue 8) on the CPU, so a limit on the way fails here and not
on the GPU: a 1M-id JSON body through the default HTTP body limit, JSON parse and validation in
seconds; the context-length checks at 1M; a long prompt (token ids) served end to end with the
prefix cache resuming prefixes of it; and dry runs of scripts/device/serve_v4flash.sh (V4_LONG=1
and two sweep parts merged into one table) on a small dummy model on the CPU backend.
V4_E2E_LONG_LEN sets the long prompt (default 16384 tokens; CPU prefill is quadratic in it)."""
import json
import os
import random
import subprocess
import sys
import time

import requests

from conftest import binary, source_dir
from test_dummy import start_serve, stop

LONG = int(os.environ.get("V4_E2E_LONG_LEN", "16384"))
CHUNK = 2048
SNAP = 4096


def default_dir():
    return os.path.join(source_dir(), "models", "default")


def dummy_args():
    """models/default's shape (vocab 4096, max_position_embeddings 1048576), dummy weights, 3
    layers (SWA, CSA, HCA)."""
    return ["--model", os.path.join(default_dir(), "config.json"), "--load-format", "dummy", "--num-layers", "3"]


def test_million_token_body_limits():
    """Default --max-body-bytes: a 1M-id prompt (~7 MB of JSON) is read, parsed and validated in
    seconds; a 1M prompt passes the context check at --context-length 1048576 (the last id is
    out of the vocabulary so nothing is computed), 1,048,576 ids do not, nor 1M + 48,577 tokens."""
    proc, base, log, log_path = start_serve(
        dummy_args() + ["--tokenizer", os.path.join(default_dir(), "tokenizer.json"), "--kv-cache-bytes",
                        str(64 << 20), "--disable-prefix-cache", "--context-length", "1048576"])
    try:
        name = requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        rng = random.Random(3)
        ids = [rng.randrange(100, 4096) for _ in range(1_000_000)]
        body = json.dumps({"model": name, "prompt": ids[:-1] + [4103], "max_tokens": 64}, separators=(",", ":"))
        assert len(body) > 4_000_000
        t0 = time.time()
        r = requests.post(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"},
                          timeout=120)
        dt = time.time() - t0
        assert r.status_code == 400, r.text[:300]
        # Only the last id is outside the vocabulary: the server read and parsed the body to its end.
        assert "token id 4103" in r.text and "vocabulary" in r.text, r.text[:300]
        assert dt < 20, f"1M-id body took {dt:.1f} s to read, parse and validate"
        # The same size as the real run's body (ids up to 129280: 6 digits) fits the default limit.
        big = json.dumps({"prompt": [rng.randrange(100000, 129280) for _ in range(1_000_000)]}, separators=(",", ":"))
        assert len(big) < 32 << 20, len(big)
        r = requests.post(base + "/v1/completions", json={"model": name, "prompt": ids + [5] * 48576, "max_tokens": 1},
                          timeout=120)
        assert r.status_code == 400 and "context_length_exceeded" in r.text, r.text[:300]
        r = requests.post(base + "/v1/completions", json={"model": name, "prompt": ids, "max_tokens": 48577},
                          timeout=120)
        assert r.status_code == 400 and "context_length_exceeded" in r.text, r.text[:300]
        m = requests.get(base + "/v1/models", timeout=10).json()["data"][0]
        assert m["max_model_len"] == 1048576
    finally:
        stop(proc, log)


def run_device_script(env_extra, timeout=900):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("V4_"):
            del env[k]
    env.update({"V4_SKIP_BUILD": "1", "V4SERVE_BIN": binary(), "V4_PORT": "0",
                "V4_TOKENIZER": os.path.join(default_dir(), "tokenizer.json"),
                "V4_MODEL_ARGS": " ".join(dummy_args() + ["--kv-cache-bytes", str(256 << 20)]),
                "V4_CHUNK": str(CHUNK), "V4_MAX_RUNNING": "8", "V4_COMMIT": "e2e"})
    env.update(env_extra)
    return subprocess.run(["bash", os.path.join(source_dir(), "scripts", "device", "serve_v4flash.sh")],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=source_dir())


def test_long_request_script_dry_run(tmp_path):
    """V4_LONG=1 end to end on the CPU: the LONG-token request over HTTP (usage checked by the
    client: prompt tokens as sent, completion tokens = max_tokens), peak pool memory from
    /metrics, then prefixes of it resumed from the prefix cache at the last snapshot boundary."""
    out = tmp_path / "out"
    ctx_a = 3 * SNAP  # resumes at 2 * SNAP (the last boundary <= len - 1)
    r = run_device_script({"OUT": str(out), "V4_LONG": "1", "V4_LONG_LEN": str(LONG),
                           "V4_LONG_CONTEXTS": f"{ctx_a} {SNAP // 2}", "V4_LONG_OUT": "8",
                           "V4_LONG_SNAPSHOT": str(SNAP), "V4_LONG_PREFIX_BYTES": str(128 << 20),
                           "V4_BUDGET_S": "800"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "long_request rc=0" in r.stdout, r.stdout[-3000:]
    res = json.load(open(out / "long-request.json"))
    reqs = res["requests"]
    assert [q["prompt_len"] for q in reqs] == [LONG, ctx_a, SNAP // 2]
    for q in reqs:
        assert q["error"] == "", q
        assert q["completion_tokens"] == 8 and q["decode_tok_s"] > 0 and q["ttft_s"] > 0, q
    assert reqs[0]["cached_tokens"] == 0
    assert reqs[1]["cached_tokens"] == ctx_a - SNAP, reqs[1]
    assert reqs[0]["body_bytes"] > 2 * LONG
    vp = res["pools"]["virtual_pages"]
    # Polled peak: a lower bound (the last poll may precede the last prefill steps).
    assert vp["used_pages"] >= -(-LONG // 256) // 2, vp
    assert vp["used_bytes"] > 0 and vp["capacity_bytes"] >= vp["used_bytes"], vp
    md = (out / "long-request.md").read_text()
    assert "| virtual_pages |" in md and "e2e" in md and "V4_LONG='1'" in md, md
    assert f"ceil({LONG + 8:,} / 256) = {-(-(LONG + 8) // 256)} virtual pages" in md, md
    assert (out / "long-results.tgz").exists()


def test_sweep_parts_dry_run(tmp_path):
    """Two sweep calls (parts a and b) on the CPU, then the merge: one table with every level,
    each call's command, and a level that cannot fit the deadline skipped, not run."""
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    common = {"V4_IN_LEN": "48", "V4_OUT_LEN": "6", "V4_LAYERS": "3"}
    r = run_device_script(dict(common, OUT=str(out_a), V4_SWEEP="1 2", V4_PART="a"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run_device_script(dict(common, OUT=str(out_b), V4_SWEEP="4", V4_PART="b"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    pa = json.load(open(out_a / "sweep-part-a.json"))
    pb = json.load(open(out_b / "sweep-part-b.json"))
    assert pa["meta"]["levels_done"] == [1, 2] and pb["meta"]["levels_done"] == [4], (pa["meta"], pb["meta"])
    assert "V4_SWEEP='1 2'" in pa["meta"]["command"] and pa["meta"]["commit"] == "e2e"
    assert "--chunked-prefill-size 2048" in pa["meta"]["server"]
    for row in pa["rows"] + pb["rows"]:
        assert row["failed"] == 0 and row["requests"] == row["concurrency"], row
    assert [g["concurrency"] for g in pa["gpu"]] == [1, 2]
    md_path, png = tmp_path / "merged.md", tmp_path / "merged.png"
    r = subprocess.run([sys.executable, os.path.join(source_dir(), "bench", "serving", "sweep_parts.py"), "merge",
                        str(out_a / "sweep-part-a.json"), str(out_b / "sweep-part-b.json"), "--out-md", str(md_path),
                        "--out-png", str(png)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    md = md_path.read_text()
    for c in (1, 2, 4):
        assert any(l.startswith(f"| {c} |") for l in md.splitlines()), md
    assert "part `a`" in md and "part `b`" in md and "V4_SWEEP='4'" in md, md
    assert "scaled by 43/3" in md
    # The deadline guard: an 8K-in level at 256 concurrency cannot fit 60 s.
    r = subprocess.run([sys.executable, os.path.join(source_dir(), "bench", "serving", "sweep_parts.py"), "run",
                        "--base-url", "http://127.0.0.1:9", "--levels", "256", "--layers", "8", "--part", "x",
                        "--out-dir", str(tmp_path / "x"), "--deadline", str(time.time() + 60)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    px = json.load(open(tmp_path / "x" / "sweep-part-x.json"))
    assert px["meta"]["levels_done"] == [] and px["meta"]["levels_skipped"][0]["concurrency"] == 256, px["meta"]
