"""Command-line checks that need no model run: every numeric flag of serve / generate / bench /
info with a range is refused with one line naming the flag, what it accepts and what it got
(src/cli/validators.h; CLI11's own checks printed "Value -1 not in range 0.000000 to 1.797...e308"
for integer flags), and `bench --profile` on a backend without device timers is refused before
the weights load."""
import os
import time

import pytest

from conftest import binary, source_dir
import subprocess

MODEL = os.path.join(source_dir(), "models", "default")
FLASH = os.path.join(source_dir(), "models", "configs", "v4-flash")


def run(args, timeout=60):
    return subprocess.run([binary()] + args, capture_output=True, text=True, timeout=timeout)


# (command, flag, bad value, expected message after "FLAG: ")
CASES = [
    ("serve", "--port", "-1", "must be in [0, 65535] (got -1)"),
    ("serve", "--port", "70000", "must be in [0, 65535] (got 70000)"),
    ("serve", "--chunked-prefill-size", "0", "must be >= 1 (got 0)"),
    ("serve", "--max-running-requests", "0", "must be >= 1 (got 0)"),
    ("serve", "--max-running-requests", "4294967296", "must be <= 2147483647 (got 4294967296)"),
    ("serve", "--kv-cache-bytes", "0", "must be >= 1 (got 0)"),
    ("serve", "--mem-fraction", "1.5", "must be in [0, 1] (got 1.5)"),
    ("serve", "--context-length", "-1", "must be >= 0 (got -1)"),
    ("serve", "--prefix-cache-bytes", "-5", "must be >= 0 (got -5)"),
    ("serve", "--prefix-snapshot-interval", "-1", "must be >= 0 (got -1)"),
    ("serve", "--prefix-snapshot-interval", "99999999999999999999",
     "must be <= 9223372036854775807 (got 99999999999999999999)"),
    ("serve", "--http-threads", "0", "must be in [1, 1024] (got 0)"),
    ("serve", "--max-body-bytes", "0", "must be >= 1 (got 0)"),
    ("serve", "--header-timeout", "0", "must be > 0 (got 0)"),
    ("serve", "--idle-timeout", "-1", "must be > 0 (got -1)"),
    ("serve", "--stats-interval", "-1", "must be >= 0 (got -1)"),
    ("serve", "--shutdown-timeout", "-0.5", "must be >= 0 (got -0.5)"),
    ("serve", "--shutdown-timeout", "inf", "must be a number (got 'inf')"),
    ("serve", "--num-layers", "0", "must be >= 1 (got 0)"),
    ("generate", "--max-new-tokens", "0", "must be >= 1 (got 0)"),
    ("generate", "--temperature", "-1", "must be >= 0 (got -1)"),
    ("generate", "--temperature", "nan", "must be a number (got 'nan')"),
    ("generate", "--threads", "-1", "must be in [0, 4096] (got -1)"),
    ("generate", "--kv-budget-mb", "0", "must be >= 1 (got 0)"),
    ("generate", "--mem-fraction", "-0.1", "must be in [0, 1] (got -0.1)"),
    ("generate", "--num-layers", "-3", "must be >= 1 (got -3)"),
    ("bench", "--prefill-chunk", "0", "must be >= 1 (got 0)"),
    ("bench", "--steps", "0", "must be >= 1 (got 0)"),
    ("bench", "--steps", "ten", "must be an integer (got 'ten')"),
    ("bench", "--warmup", "-1", "must be >= 0 (got -1)"),
    ("bench", "--prefill-steps", "0", "must be >= 1 (got 0)"),
    ("bench", "--prefill-warmup", "-1", "must be >= 0 (got -1)"),
    ("bench", "--mem-fraction", "0", "must be in (0, 1] (got 0)"),
    ("bench", "--kv-cache-bytes", "-1", "must be >= 0 (got -1)"),
    ("bench", "--peak-tflops", "-3", "must be >= 0 (got -3)"),
    ("bench", "--copy-mib", "-1", "must be >= 0 (got -1)"),
    ("bench", "--threads", "5000", "must be in [0, 4096] (got 5000)"),
    ("bench", "--num-layers", "0", "must be >= 1 (got 0)"),
    ("info", "--num-layers", "0", "must be >= 1 (got 0)"),
]


@pytest.mark.parametrize("cmd,flag,value,want", CASES, ids=[f"{c}{f}={v}" for c, f, v, _ in CASES])
def test_numeric_flag_ranges(cmd, flag, value, want):
    r = run([cmd, "--model", MODEL, f"{flag}={value}"])
    out = r.stdout + r.stderr
    assert r.returncode == 2, (r.returncode, out)  # usage errors exit 2 (not CLI11's 101-120)
    assert f"{flag}: {want}" in out, out
    assert "not in range" not in out and "1.797" not in out, out
    # One error line (plus CLI11's "Run with --help" hint), nothing loaded.
    lines = [l for l in out.splitlines() if l.strip() and not l.startswith("Run with --help")]
    assert len(lines) == 1, out


def test_in_range_values_still_parse():
    # Values at the edges of the ranges are accepted (the command then fails for another reason:
    # no such model directory), so the checks are not off by one.
    r = run(["serve", "--model", "/nonexistent", "--port", "0", "--mem-fraction", "0",
             "--prefix-snapshot-interval", "0", "--http-threads", "1", "--shutdown-timeout", "0",
             "--context-length", "0", "--num-layers", "1"])
    assert "must be" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "/nonexistent" in r.stdout + r.stderr
    r = run(["bench", "--model", "/nonexistent", "--mem-fraction", "1", "--warmup", "0",
             "--prefill-warmup", "0", "--kv-cache-bytes", "0", "--peak-tflops", "0"])
    assert "must be" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_bench_profile_refused_before_loading():
    """`bench --profile` on the CPU: one line, exit 2, before the weights load. A V4-Flash shape
    (dummy weights) would be refused by the load guard or take minutes if loading came first."""
    t = time.time()
    r = run(["bench", "--model", FLASH, "--load-format", "dummy", "--device", "cpu", "--profile",
             "--batch", "1", "--context", "64", "--steps", "1"])
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert time.time() - t < 30, out
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1, out
    assert "--profile" in lines[0] and "cpu backend has no device timers" in lines[0], out
    assert "loading" not in out and "available" not in out, out  # no load, no load guard
    # The embedded model: same refusal, no "model ready" line.
    r = run(["bench", "--model", MODEL, "--profile", "--batch", "1", "--context", "64"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "model ready" not in r.stdout + r.stderr


def test_bench_without_profile_says_why_on_cpu(tmp_path):
    """A CPU bench run (no --profile) says in its report that no per-region profile was taken and
    why (the backend has no device timers)."""
    out = tmp_path / "bench.md"
    r = run(["bench", "--model", MODEL, "--batch", "1", "--context", "256", "--steps", "1",
             "--warmup", "0", "--prefill-steps", "1", "--prefill-warmup", "0", "--prefill-chunk",
             "128", "--kv-cache-bytes", "100000000", "--copy-mib", "8", "--out", str(out)],
            timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    md = out.read_text()
    assert "per-region profile: not taken (the cpu backend has no device timers" in md, md
    assert "| prefill | 256 | 1 | 128 |" in md, md


LIST_CASES = [
    ("--batch", "0", "--batch '0': expected positive integers like 1,16,4K,1M"),
    ("--batch", "", "--batch: empty list"),
    ("--context", "-4K", "--context '-4K': expected positive integers like 1,16,4K,1M"),
    ("--context", "1.5K", "--context '1.5K': expected positive integers like 1,16,4K,1M"),
    # 9999999999999999 * 1024 is past int64: was a wrapped negative context, then an error naming
    # --mem-fraction ("KV budget -2936779053.12 GiB ... workspace reserve").
    ("--context", "9999999999999999K", "--context '9999999999999999K': expected positive integers"),
    ("--batch", "1,99999999999999M", "--batch '1,99999999999999M': expected positive integers"),
]


@pytest.mark.parametrize("flag,value,want", LIST_CASES, ids=[f"{f}={v}" for f, v, _ in LIST_CASES])
def test_bench_lists_refused_before_loading(flag, value, want):
    """`bench --batch/--context` lists are checked before the weights load (one line, exit 2): a
    V4-Flash shape with dummy weights would take minutes to load before the typo was reported."""
    t = time.time()
    r = run(["bench", "--model", FLASH, "--load-format", "dummy", "--device", "cpu", flag, value])
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert time.time() - t < 30, out
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1 and want in lines[0], out
    assert "loading" not in out and "model ready" not in out and "available" not in out, out


@pytest.mark.parametrize("cmd,flag", [("generate", "--seed"), ("bench", "--seed"),
                                      ("serve", "--dummy-seed"), ("generate", "--dummy-seed")])
def test_seed_flags_say_what_they_accept(cmd, flag):
    """Seeds are non-negative integers: text or a negative value is refused like the other integer
    flags (was CLI11's "Could not convert: --seed = abc"; -1 was taken as 2^64 - 1)."""
    for value, want in (("abc", "must be an integer (got 'abc')"), ("-1", "must be >= 0 (got -1)")):
        r = run([cmd, "--model", MODEL, f"{flag}={value}"])
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert f"{flag}: {want}" in out, out
        lines = [l for l in out.splitlines() if l.strip() and not l.startswith("Run with --help")]
        assert len(lines) == 1, out


def _serve_until_ready(args, env=None):
    """`serve --model MODEL --port 0 --disable-prefix-cache ARGS` until its serving line (or exit);
    returns the output lines so far."""
    p = subprocess.Popen([binary(), "serve", "--model", MODEL, "--port", "0", "--disable-prefix-cache"] + args,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "serving '" in line:
                break
    finally:
        p.terminate()
        p.wait(timeout=60)
    return lines


def test_serve_context_length_above_the_model_warns():
    """--context-length above max_position_embeddings is served at the model's limit with a
    warning naming the flag (it was cut silently: a client then got context_length_exceeded
    errors below the length it configured)."""
    lines = _serve_until_ready(["--context-length", "99999999999"])
    out = "".join(lines)
    assert "context 1048576 tokens" in out, out
    warn = [l for l in lines if "--context-length 99999999999" in l]
    assert len(warn) == 1 and "1048576" in warn[0], out


@pytest.mark.parametrize("how", ["flag", "env"])
def test_serve_empty_api_key_warns(how):
    """`--api-key ''` (an unset variable expanded to nothing) or V4SERVE_API_KEY='' serves without
    authentication, as vLLM does, but says so at startup (it used to be silent); no key at all
    does not warn."""
    env = {k: v for k, v in os.environ.items() if k != "V4SERVE_API_KEY"}
    if how == "env":
        env["V4SERVE_API_KEY"] = ""
    lines = _serve_until_ready(["--api-key", ""] if how == "flag" else [], env)
    out = "".join(lines)
    assert "serving '" in out, out
    warn = [l for l in lines if "API key is empty" in l]
    assert len(warn) == 1 and "no authentication is required" in warn[0], out
    assert "(API key required)" not in out, out
    plain = "".join(_serve_until_ready([], {k: v for k, v in env.items() if k != "V4SERVE_API_KEY"}))
    assert "serving '" in plain and "API key is empty" not in plain, plain


@pytest.mark.parametrize("args", [
    ["generate", "--model", MODEL, "--prompt", "A", "--kv-budget-mb", "1099511627776"],
    ["serve", "--model", MODEL, "--port", "0", "--kv-cache-bytes", "1000000000000000000"],
    ["serve", "--model", MODEL, "--port", "0", "--prefix-cache-bytes", "1000000000000000000"],
])
def test_kv_budget_beyond_free_memory_is_one_line(args):
    # A budget no machine has: refused with the numbers before any allocation (a std::bad_alloc
    # abort, exit 134, before session 18).
    r = run(args, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-400:])
    assert "exceed the cpu backend's free memory" in r.stderr, r.stderr[-400:]
    assert "bad_alloc" not in r.stderr


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "40000"])
def test_bad_num_threads_env_is_reported_not_fatal(value):
    env = dict(os.environ, V4_NUM_THREADS=value)
    r = subprocess.run([binary(), "generate", "--model", MODEL, "--prompt", "A",
                        "--max-new-tokens", "2"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, (r.returncode, r.stderr[-400:])
    assert f"V4_NUM_THREADS='{value}' ignored" in r.stderr, r.stderr[-400:]


def _bad_config_dir(tmp_path):
    """The embedded model's config.json with a `layer_types` list one entry short (an invalid
    config: refused in one line naming the field)."""
    import json
    import shutil
    d = tmp_path / "bad"
    d.mkdir()
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    cfg["layer_types"] = cfg["layer_types"][:-1]
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(os.path.join(MODEL, "tokenizer.json"), d / "tokenizer.json")
    return str(d)


def test_invalid_config_same_exit_code_everywhere(tmp_path):
    """An invalid config.json is a usage error for every command that reads it: exit 2 and one
    line naming the field (info returned 1, generate / serve 2)."""
    d = _bad_config_dir(tmp_path)
    for args in (["info", "--model", d], ["info", "--model", d, "--load-format", "dummy"],
                 ["generate", "--model", d, "--prompt", "hi", "--max-new-tokens", "1"]):
        r = run(args)
        out = r.stdout + r.stderr
        assert r.returncode == 2, (args, out)
        lines = [l for l in out.splitlines() if l.strip()]
        assert len(lines) == 1 and "layer_types" in lines[0], (args, out)


def test_info_without_weights_prints_only_the_error(tmp_path):
    """`info` on a directory holding a config.json alone: the one-line error (with the hint to use
    --load-format dummy), exit 1, and no config summary before it."""
    import shutil
    d = tmp_path / "cfgonly"
    d.mkdir()
    shutil.copy(os.path.join(MODEL, "config.json"), d / "config.json")
    r = run(["info", "--model", str(d)])
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout == "", r.stdout
    assert "--load-format dummy" in r.stderr, r.stderr
    r = run(["info", "--model", str(d), "--load-format", "dummy"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== config" in r.stdout, r.stdout


def test_info_on_unreadable_weights_names_the_problem(tmp_path):
    """A model.safetensors that exists but cannot be read: the error names it (a directory is
    called a directory, not "mmap failed: No such device") and carries no --load-format dummy hint,
    which is for a directory without weights."""
    import shutil
    d = tmp_path / "dirweights"
    d.mkdir()
    shutil.copy(os.path.join(MODEL, "config.json"), d / "config.json")
    (d / "model.safetensors").mkdir()
    r = run(["info", "--model", str(d)])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "is a directory, not a safetensors file" in r.stderr, r.stderr
    assert "--load-format dummy" not in r.stderr, r.stderr
    t = tmp_path / "trunc"
    t.mkdir()
    shutil.copy(os.path.join(MODEL, "config.json"), t / "config.json")
    (t / "model.safetensors").write_bytes(b"\x10\x00\x00")
    r = run(["info", "--model", str(t)])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "truncated" in r.stderr and "--load-format dummy" not in r.stderr, r.stderr


def test_generate_reports_tokenizer_problems_before_the_weights(tmp_path):
    """`generate --prompt` on a directory whose tokenizer.json is missing or corrupt: the one-line
    tokenizer error, before any weights are read (the directory has none here, so an error about
    weights would mean the model was loaded first)."""
    import shutil
    d = tmp_path / "notok"
    d.mkdir()
    shutil.copy(os.path.join(MODEL, "config.json"), d / "config.json")
    r = run(["generate", "--model", str(d), "--prompt", "hi"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tokenizer.json" in r.stderr and "safetensors" not in r.stderr, r.stderr
    (d / "tokenizer.json").write_text("{not json")
    r = run(["generate", "--model", str(d), "--prompt", "hi"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tokenizer" in r.stderr and "safetensors" not in r.stderr, r.stderr
    assert r.stderr.count("\n") <= 1, r.stderr


@pytest.mark.parametrize("field,value", [("scoring_func", "tanh"), ("hidden_act", "gelu"),
                                         ("rms_norm_eps", -1)])
def test_unsupported_config_values_exit_like_other_config_errors(tmp_path, field, value):
    """A config value the engine does not implement (scoring_func, hidden_act) is a config error
    like any other: exit 2 and one line naming the field (they exited 1)."""
    import json
    import shutil
    d = tmp_path / "cfg"
    d.mkdir()
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    cfg[field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(os.path.join(MODEL, "tokenizer.json"), d / "tokenizer.json")
    for args in (["info", "--model", str(d), "--load-format", "dummy"],
                 ["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "1"]):
        r = run(args)
        out = r.stdout + r.stderr
        assert r.returncode == 2, (args, out)
        lines = [l for l in out.splitlines() if l.strip()]
        assert len(lines) == 1 and field in lines[0], (args, out)
