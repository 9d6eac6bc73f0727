"""--load-format dummy end to end on the CPU: `generate` with a tiny config cut by --num-layers,
`serve` from a directory holding only config.json (+ --tokenizer) answering /v1/completions with
token-id prompts, the one-line error when no tokenizer is found, and `v4serve bench` writing a
table with every cell."""
import os
import shutil
import subprocess

import requests

from conftest import binary, launch_serve, source_dir


def fixture(name):
    return os.path.join(source_dir(), "tests", "fixtures", name)


def run(args, timeout=300):
    return subprocess.run([binary()] + args, capture_output=True, text=True, timeout=timeout)


def tokens_of(out):
    line = [l for l in out.splitlines() if l.startswith("tokens: ")]
    assert line, out
    return [int(t) for t in line[0][len("tokens: "):].split(",")]


def test_generate_dummy_num_layers():
    args = ["generate", "--model", fixture("tiny-kinds-fp32"), "--load-format", "dummy", "--num-layers", "2",
            "--prompt-ids", "1,2,3,4,5,6,7,8,9", "--max-new-tokens", "6", "--ignore-eos", "--threads", "2"]
    a = run(args)
    assert a.returncode == 0, a.stdout + a.stderr
    assert "expert routing is roughly uniform" in a.stderr
    ta = tokens_of(a.stdout)
    assert len(ta) == 6 and all(0 <= t < 256 for t in ta)
    b = run(args)
    assert tokens_of(b.stdout) == ta, "same --dummy-seed: same weights, same greedy tokens"
    # The config file itself works as --model too.
    c = run(args[:2] + [os.path.join(fixture("tiny-kinds-fp32"), "config.json")] + args[3:])
    assert c.returncode == 0 and tokens_of(c.stdout) == ta, c.stdout + c.stderr
    bad = run(args[:6] + ["9"] + args[7:])
    assert bad.returncode != 0
    assert "--num-layers 9: must be in [1, 4]" in bad.stderr, bad.stderr


def start_serve(args):
    """`v4serve serve ARGS` on a port the kernel picks: (proc, base_url, log_file, log_path)."""
    try:
        return launch_serve(["--stats-interval", "0"] + list(args), name="dummy", timeout=120)
    except RuntimeError as e:
        raise AssertionError(f"serve did not become healthy: {e}") from None


def stop(proc, log):
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def test_serve_dummy_config_only(tmp_path):
    cfg_dir = tmp_path / "shape-only"
    cfg_dir.mkdir()
    default = os.path.join(source_dir(), "models", "default")
    shutil.copy(os.path.join(default, "config.json"), cfg_dir / "config.json")
    # No tokenizer in the directory: one line naming the flag, exit code 2.
    r = run(["serve", "--model", str(cfg_dir), "--load-format", "dummy", "--port", "0"], timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no tokenizer.json in" in r.stdout + r.stderr and "--tokenizer" in r.stdout + r.stderr
    # Without dummy, a config-only directory is refused with a hint.
    r = run(["serve", "--model", str(cfg_dir), "--tokenizer", os.path.join(default, "tokenizer.json"),
             "--port", "0"], timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "--load-format dummy" in r.stdout + r.stderr
    proc, base, log, log_path = start_serve(
        ["--model", str(cfg_dir), "--load-format", "dummy", "--num-layers", "3",
         "--tokenizer", os.path.join(default, "tokenizer.json"), "--kv-cache-bytes", str(64 << 20),
         "--disable-prefix-cache"])
    try:
        for prompt in ([5, 6, 7, 8, 9, 10, 11], [[100, 200, 300], [7] * 40]):
            resp = requests.post(base + "/v1/completions", timeout=120, json={
                "model": "shape-only", "prompt": prompt, "max_tokens": 5, "temperature": 0,
                "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            n = 1 if isinstance(prompt[0], int) else len(prompt)
            assert len(body["choices"]) == n
            assert body["usage"]["completion_tokens"] == 5 * n, body
            assert body["usage"]["prompt_tokens"] == sum(len(p) for p in (prompt if n > 1 else [prompt]))
    finally:
        stop(proc, log)
    text = open(log_path).read()
    assert "expert routing is roughly uniform" in text, text


def test_bench_tiny_dummy(tmp_path):
    out = tmp_path / "bench.md"
    r = run(["bench", "--model", fixture("tiny-kinds-fp32"), "--load-format", "dummy", "--batch", "1,2",
             "--context", "64,256", "--steps", "2", "--warmup", "1", "--prefill-chunk", "32",
             "--kv-cache-bytes", str(64 << 20), "--out", str(out)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    md = out.read_text()
    assert "expert routing is roughly uniform" in md
    decode = [l for l in md.splitlines() if l.startswith("| decode |")]
    prefill = [l for l in md.splitlines() if l.startswith("| prefill |")]
    assert len(decode) == 4, md  # 2 contexts x 2 batches
    assert len(prefill) == 2, md
    for row in decode + prefill:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert "does not fit" not in row, row
        assert float(cells[4]) > 0, row  # ms per step
