"""Smoke run of the serving benchmark client (bench/serving/bench_serving.py) against a real
`v4serve serve` on the embedded model: every request succeeds and the Markdown table is written."""
import json
import os
import subprocess
import sys

from conftest import source_dir


def test_bench_serving_smoke(server, tmp_path):
    out = tmp_path / "bench.md"
    cmd = [sys.executable, os.path.join(source_dir(), "bench", "serving", "bench_serving.py"),
           "--base-url", server.base, "--api-key", server.api_key, "--input-len", "32", "--output-len", "8",
           "--concurrency", "1", "4", "--label", "ci-smoke", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    md = out.read_text()
    assert "| conc | reqs | fail |" in md
    rows = [l for l in md.splitlines() if l.startswith("| 1 |") or l.startswith("| 4 |")]
    assert len(rows) == 2, md
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "0", row  # no failed requests
        assert float(cells[-2]) > 0, row  # tok/s/GPU


def test_bench_serving_shared_prefix(server, tmp_path):
    """--dataset shared-prefix: a common system prompt + distinct questions. From the third request
    on every request resumes at the system prompt (the prefix cache is on by default in serve), so
    the reported hit rate (usage and /metrics) is well above zero; the JSON rows carry it."""
    out, js = tmp_path / "prefix.md", tmp_path / "prefix.json"
    cmd = [sys.executable, os.path.join(source_dir(), "bench", "serving", "bench_serving.py"),
           "--base-url", server.base, "--api-key", server.api_key, "--dataset", "shared-prefix",
           "--prefix-len", "300", "--input-len", "16", "--output-len", "4", "--concurrency", "1", "4",
           "--num-prompts", "8", "--label", "ci-prefix", "--out", str(out), "--json-out", str(js)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    md = out.read_text()
    assert "shared prefix: 1 system prompt(s) of 300 token ids" in md, md
    rows = json.loads(js.read_text())
    assert [row["concurrency"] for row in rows] == [1, 4]
    for row in rows:
        assert row["failed"] == 0, row
        assert row["in_tokens"] >= 8 * (300 + 12), row
        # usage.prompt_tokens_details.cached_tokens: at least 6 of 8 requests resume at 300
        assert row["hit_rate"] > 0.6, row
        assert row["metrics_hit_rate"] > 0.5, row
        assert row["ttft_mean_ms"] > 0, row
