#!/usr/bin/env python3
"""One very long request over HTTP (issue 8: a 1,000,000-token prompt), then single-request
decode speed at shorter contexts. Standard library only.

1. POST /v1/completions with --prompt-len random token ids (JSON body of ~7 bytes per id),
   streaming, ignore_eos, greedy, --max-tokens output tokens, usage included. Reports the body
   size and client encode time, TTFT, decode tok/s ((tokens - 1) / (last - first token time)),
   usage (prompt / completion / cached tokens). While it runs, /metrics is polled every
   --poll-s seconds: the peak of v4serve_cache_used_pages / _used_bytes per pool is the
   request's memory per pool (the server frees it at the end unless the prefix cache keeps it).
2. For each context in --decode-contexts: one request whose prompt is the first `c` ids of the
   long prompt (with the server's prefix cache on and --prefix-snapshot-interval dividing c,
   most of it is a cache hit; usage.cached_tokens says how much), --max-tokens output tokens:
   TTFT and decode tok/s at ~c context.
Every request gets the time left before --deadline (epoch s) as its timeout; one that does not
fit is recorded as such. The result is written after every request (--out-md, --out-json).
Exit status 1 when any request failed.
"""
import argparse
import datetime as dt
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_parts import scrape  # noqa: E402  (the /metrics reader shared with the sweep)


def vocab_size(base):
    """Largest id /detokenize accepts (binary search; 400 outside the vocabulary)."""
    lo, hi = 1, 1 << 20
    while lo < hi:
        mid = (lo + hi + 1) // 2
        req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": [mid - 1]}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30).read()
            lo = mid
        except urllib.error.HTTPError:
            hi = mid - 1
    return lo


class Poller:
    """Polls /metrics in a thread; keeps the peak of every cache gauge."""

    def __init__(self, base, period):
        self.base, self.period, self.peak, self.samples = base, period, {}, 0
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stop_ev.is_set():
            m = scrape(self.base)
            self.samples += 1 if m else 0
            for k, v in m.items():
                if k.startswith(("v4serve_cache_used_", "v4serve_num_requests_running")):
                    self.peak[k] = max(self.peak.get(k, 0.0), v)
            self.stop_ev.wait(self.period)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.t.join(timeout=30)


def one(base, model, ids, max_tokens, timeout):
    """Streams one completion; returns a dict of timings and usage (error set on failure)."""
    r = {"prompt_len": len(ids), "max_tokens": max_tokens, "error": ""}
    t_enc = time.perf_counter()
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
                      separators=(",", ":")).encode()
    r["body_bytes"] = len(body)
    r["encode_s"] = time.perf_counter() - t_enc
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    times, usage = [], None
    try:
        with urllib.request.urlopen(req, timeout=max(1.0, timeout)) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices"):  # a token chunk (its text may be empty: partial UTF-8)
                    times.append(time.perf_counter())
    except urllib.error.HTTPError as e:
        r["error"] = f"HTTP {e.code}: {e.read()[:300]!r}"
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        r["error"] = repr(e)[:300]
    r["total_s"] = time.perf_counter() - t0
    r["ttft_s"] = (times[0] - t0) if times else float("nan")
    r["chunks"] = len(times)
    u = usage or {}
    n_out = int(u.get("completion_tokens", 0))
    # Tokens after the first over the time from the first chunk to the last.
    r["decode_tok_s"] = (n_out - 1) / (times[-1] - times[0]) if n_out > 1 and len(times) > 1 and times[-1] > times[0] \
        else float("nan")
    r["prompt_tokens"] = u.get("prompt_tokens", 0)
    r["completion_tokens"] = u.get("completion_tokens", 0)
    r["cached_tokens"] = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if not r["error"]:
        if r["prompt_tokens"] != len(ids):
            r["error"] = f"usage.prompt_tokens {r['prompt_tokens']} != {len(ids)} sent"
        elif r["completion_tokens"] != max_tokens:
            r["error"] = f"usage.completion_tokens {r['completion_tokens']} != max_tokens {max_tokens}"
    return r


def fmt(x, spec=".1f"):
    return "-" if x != x else format(x, spec)


def markdown(a, res, pools, meta):
    out = [f"# One {a.prompt_len:,}-token request over HTTP, then decode speed at shorter contexts", "",
           f"- date: {meta['date']}; commit {meta['commit']}; GPU: {meta['gpu']}",
           f"- command: `{meta['command']}`", f"- server: `{meta['server']}`",
           f"- note: {a.note}" if a.note else "- note: -",
           f"- client: bench/serving/long_request.py, random token ids (seed {a.seed}), streaming, ignore_eos, "
           f"greedy, {a.max_tokens} output tokens per request", "",
           "| request | prompt tokens | cached | body (MB) | TTFT (s) | decode tok/s | output tokens | total (s) | status |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res:
        out.append(f"| {r['what']} | {r['prompt_len']:,} | {r['cached_tokens']:,} | {r['body_bytes'] / 1e6:.1f} | "
                   f"{fmt(r['ttft_s'], '.2f')} | {fmt(r['decode_tok_s'])} | {r['completion_tokens']} | "
                   f"{r['total_s']:.1f} | {r['error'] or 'ok'} |")
    out += ["", "Prefill speed of the long request: prompt tokens / TTFT = "
            + (f"{res[0]['prompt_len'] / res[0]['ttft_s']:.0f} tok/s" if res and res[0]['ttft_s'] == res[0]['ttft_s']
               else "-"), "",
            "## Memory per pool during the long request (peak of /metrics, polled every "
            f"{a.poll_s:g} s; {pools.get('_samples', 0)} samples)", "",
            "| pool | peak used pages | capacity pages | peak used (GiB) | capacity (GiB) |", "|---|---:|---:|---:|---:|"]
    for name in sorted(p for p in pools if not p.startswith("_")):
        p = pools[name]
        gib = lambda b: "-" if b is None else f"{b / 2**30:.3f}"  # noqa: E731
        out.append(f"| {name} | {p.get('used_pages', 0):.0f} | {p.get('capacity_pages', 0):.0f} | "
                   f"{gib(p.get('used_bytes'))} | {gib(p.get('capacity_bytes'))} |")
    vp = pools.get("virtual_pages", {})
    if vp.get("capacity_pages") and vp.get("capacity_bytes") and res:
        n = res[0]["prompt_len"] + a.max_tokens
        pages = -(-n // 256)
        bpp = vp["capacity_bytes"] / vp["capacity_pages"]
        out += ["", f"Polling gives a lower bound (the last poll can precede the last step). At its end the long "
                f"request holds ceil({n:,} / 256) = {pages:,} virtual pages = {pages * bpp / 2**30:.3f} GiB "
                f"({bpp / 2**20:.3f} MiB per page, from /metrics), plus its SWA window pages and one state slot."]
    return "\n".join(out) + "\n"


def pool_table(peak, final):
    pools = {}
    for k, v in list(peak.items()) + [(k, v) for k, v in final.items() if k.startswith("v4serve_cache_capacity_")]:
        if "{pool=\"" not in k:
            continue
        name = k.split("{pool=\"", 1)[1].split("\"", 1)[0]
        field = k.split("{", 1)[0].replace("v4serve_cache_", "")
        pools.setdefault(name, {})[field] = v
    return pools


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--prompt-len", type=int, default=1_000_000)
    ap.add_argument("--decode-contexts", type=int, nargs="*", default=[921600, 131072, 4096])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--token-id-low", type=int, default=1000)
    ap.add_argument("--poll-s", type=float, default=0.5)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds; 0 = an hour per request")
    ap.add_argument("--note", default="")
    ap.add_argument("--command", default="")
    ap.add_argument("--server", default="", help="the server command line to record")
    ap.add_argument("--commit", default=os.environ.get("V4_COMMIT", "unknown"))
    ap.add_argument("--gpu", default="")
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--out-json", default="")
    a = ap.parse_args()
    base = a.base_url.rstrip("/")
    meta = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": a.commit,
            "gpu": a.gpu or "-", "command": a.command or "bench/serving/long_request.py", "server": a.server}
    model = json.load(urllib.request.urlopen(base + "/v1/models", timeout=30))["data"][0]["id"]
    vocab = vocab_size(base)
    low = min(a.token_id_low, vocab // 4)
    rng = random.Random(a.seed)
    ids = [rng.randrange(low, vocab) for _ in range(a.prompt_len)]
    res, pools = [], {}

    def left():
        return a.deadline - time.time() if a.deadline else 3600.0

    def write():
        with open(a.out_md, "w") as f:
            f.write(markdown(a, res, pools, meta))
        if a.out_json:
            with open(a.out_json, "w") as f:
                json.dump({"meta": meta, "requests": res, "pools": pools}, f, indent=1)

    with Poller(base, a.poll_s) as poll:
        r = one(base, model, ids, a.max_tokens, left())
    r["what"] = f"long ({a.prompt_len:,})"
    res.append(r)
    pools = pool_table(poll.peak, scrape(base))
    pools["_samples"] = poll.samples
    write()
    print(json.dumps(r), flush=True)
    for c in a.decode_contexts:
        c = min(c, a.prompt_len)
        if left() < 15:
            res.append({"what": f"decode at {c:,}", "prompt_len": c, "cached_tokens": 0, "body_bytes": 0,
                        "ttft_s": float("nan"), "decode_tok_s": float("nan"), "completion_tokens": 0,
                        "total_s": 0.0, "error": "skipped: deadline"})
            write()
            continue
        r = one(base, model, ids[:c], a.max_tokens, left())
        r["what"] = f"decode at {c:,}"
        res.append(r)
        write()
        print(json.dumps(r), flush=True)
    print(open(a.out_md).read())
    return 1 if any(r["error"] for r in res) else 0


if __name__ == "__main__":
    raise SystemExit(main())
