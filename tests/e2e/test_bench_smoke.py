"""Smoke run of the serving benchmark client (bench/serving/bench_serving.py) against a real
`v4serve serve` on the embedded model: every request succeeds and the Markdown table is written."""
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
        assert float(cells[-1]) > 0, row  # tok/s/GPU
