"""A request's memory does not grow with n x the size of its fields: the stop strings (up to the
body limit) are shared by the n choices, not copied into each (64 stops of 64 KiB with n = 128
took ~540 MB, so one 32 MiB body could take ~4 GB)."""

import pytest

from conftest import Server


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no VmHWM in /proc")


def test_stop_strings_are_not_copied_per_choice():
    srv = Server(extra_args=["--disable-prefix-cache"])
    try:
        srv.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})  # warm up
        before = peak_rss_mb(srv.proc.pid)
        stops = [f"{i:02d}" + "Z" * 65536 for i in range(64)]  # 4 MiB of stop strings
        r = srv.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 128, "stop": stops})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 128
        grown = peak_rss_mb(srv.proc.pid) - before
        assert grown < 150, f"peak RSS grew {grown:.0f} MB for a 4 MiB request"
    finally:
        srv.stop()
