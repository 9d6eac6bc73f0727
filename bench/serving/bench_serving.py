#!/usr/bin/env python3
"""Serving benchmark with vLLM `benchmark_serving` / InferenceX semantics, against any
OpenAI-compatible /v1/completions endpoint (v4serve, SGLang, vLLM).

Per concurrency level C (swept, e.g. 1 2 4 8): 10*C prompts (or --num-prompts), random token ids
(or random text), input and output lengths uniform in [0.8*L, L], ignore_eos, streaming. At most C
requests are in flight at a time. Metrics: TTFT, TPOT (per request: (E2E - TTFT) / (out - 1)), ITL
(gaps between streamed chunks), E2E; tok/s/user = 1000 / mean TPOT(ms); throughput = (input +
output tokens) / wall time; tok/s/GPU = throughput / --gpus.

Shared-prefix workload (--dataset shared-prefix, the prefix cache's case): every prompt is one of
--num-prefixes common "system prompts" of --prefix-len random token ids followed by a distinct
random question of [0.8*L, L] ids (L = --input-len); the system prompts are the same for every
level. Per level it also reports the prefix hit rate: cached / prompt tokens from each response's
usage.prompt_tokens_details.cached_tokens, and, when the server exposes them (v4serve), the
/metrics counters v4serve_prefix_cache_hits_total / _queries_total (delta over the level,
including its warm-up request).

Writes a Markdown table (with machine, commit, command and date) to --out (default
bench/results/serving-<date>-<label>.md) and prints it.

Example:
  python3 bench/serving/bench_serving.py --base-url http://127.0.0.1:30000 \
      --input-len 128 --output-len 32 --concurrency 1 2 4 8
  python3 bench/serving/bench_serving.py --dataset shared-prefix --prefix-len 4096 \
      --input-len 128 --output-len 64 --concurrency 1 8 32
"""
import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time

import httpx


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


class Result:
    def __init__(self):
        self.ok = False
        self.error = ""
        self.ttft = 0.0
        self.e2e = 0.0
        self.itl = []
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0


async def one_request(client, url, headers, model, prompt, out_len, res):
    body = {"model": model, "prompt": prompt, "max_tokens": out_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                    details = chunk["usage"].get("prompt_tokens_details") or {}
                    res.cached_tokens = int(details.get("cached_tokens") or 0)
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2e = time.perf_counter() - t0
        res.ok = res.output_tokens > 0
        if not res.ok:
            res.error = "no tokens"
    except Exception as e:  # noqa: BLE001 - a benchmark records failures and goes on
        res.error = repr(e)


def make_system_prompts(args, vocab):
    """The shared prefixes of --dataset shared-prefix (fixed seed: the same for every level)."""
    rng = random.Random(args.seed + 7919)
    return [[rng.randrange(args.token_id_low, vocab) for _ in range(args.prefix_len)]
            for _ in range(max(1, args.num_prefixes))]


def make_prompts(args, n, rng, vocab, detok, systems=None):
    prompts = []
    for i in range(n):
        in_len = rng.randint(max(1, int(0.8 * args.input_len)), args.input_len)
        out_len = rng.randint(max(1, int(0.8 * args.output_len)), args.output_len)
        ids = [rng.randrange(args.token_id_low, vocab) for _ in range(in_len)]
        if args.dataset == "shared-prefix":
            sys_ids = systems[i % len(systems)]
            prompts.append((sys_ids + ids, len(sys_ids) + in_len, out_len))
        else:
            prompts.append((ids if args.dataset == "random-ids" else detok(ids), in_len, out_len))
    return prompts


def scrape_metrics(client, base, headers):
    """Numeric samples of /metrics ({} when the server has none)."""
    try:
        r = client.get(base + "/metrics", headers=headers)
        if r.status_code != 200:
            return {}
    except httpx.HTTPError:
        return {}
    m = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        k, _, v = line.rpartition(" ")
        try:
            m[k] = float(v)
        except ValueError:
            pass
    return m


async def run_level(args, url, headers, model, prompts, concurrency):
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)
        results = [Result() for _ in prompts]

        async def worker(i):
            async with sem:
                p, _, out_len = prompts[i]
                await one_request(client, url, headers, model, p, out_len, results[i])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(len(prompts))))
        wall = time.perf_counter() - t0
    return results, wall


def summarize(results, wall, concurrency, gpus):
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [x for r in ok for x in r.itl]
    tin = sum(r.prompt_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    tcached = sum(r.cached_tokens for r in ok)
    mean_tpot_ms = mean(tpots) * 1000
    return {
        "concurrency": concurrency, "requests": len(results), "failed": len(results) - len(ok),
        "wall_s": wall, "in_tokens": tin, "out_tokens": tout, "cached_tokens": tcached,
        "hit_rate": tcached / tin if tin else float("nan"),
        "ttft_mean_ms": mean([r.ttft for r in ok]) * 1000,
        "ttft_p50_ms": percentile([r.ttft for r in ok], 50) * 1000,
        "ttft_p99_ms": percentile([r.ttft for r in ok], 99) * 1000,
        "tpot_mean_ms": mean_tpot_ms, "tpot_p50_ms": percentile(tpots, 50) * 1000,
        "tpot_p99_ms": percentile(tpots, 99) * 1000,
        "itl_mean_ms": mean(itls) * 1000, "itl_p50_ms": percentile(itls, 50) * 1000,
        "itl_p99_ms": percentile(itls, 99) * 1000,
        "e2e_mean_ms": mean([r.e2e for r in ok]) * 1000, "e2e_p99_ms": percentile([r.e2e for r in ok], 99) * 1000,
        "tok_s_user": 1000.0 / mean_tpot_ms if tpots and mean_tpot_ms > 0 else float("nan"),
        "out_tok_s": tout / wall if wall > 0 else 0.0,
        "total_tok_s": (tin + tout) / wall if wall > 0 else 0.0,
        "tok_s_gpu": (tin + tout) / wall / gpus if wall > 0 else 0.0,
        "errors": sorted({r.error for r in results if not r.ok})[:3],
    }


def machine_line():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} logical CPUs" + (f"; GPU: {gpu}" if gpu else "; no GPU")


def git_commit():
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        c = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return c + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pct(x):
    return "-" if x != x else f"{100 * x:.1f}%"


def markdown(rows, args, model, server_info):
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# Serving benchmark: {args.label}", "",
           f"- date: {now}", f"- machine: {machine_line()}", f"- commit: {git_commit()}",
           f"- command: `{' '.join(shlex.quote(a) for a in sys.argv)}`",
           f"- server: {server_info}", f"- model: {model}"] + ([f"- note: {args.note}"] if args.note else []) + [
           (f"- shared prefix: {max(1, args.num_prefixes)} system prompt(s) of {args.prefix_len} token ids, "
            f"request i uses system prompt i mod {max(1, args.num_prefixes)}; 'input len' below is the question"
            if args.dataset == "shared-prefix" else "- no shared prefix"),
           f"- workload: {args.dataset}, input len uniform in [{int(0.8 * args.input_len)}, {args.input_len}], "
           f"output len uniform in [{int(0.8 * args.output_len)}, {args.output_len}], ignore_eos, streaming, "
           f"temperature 0, {(f'{args.num_prompts_factor:g}x concurrency' if not args.num_prompts else args.num_prompts)} prompts per level, "
           f"seed {args.seed}, GPUs counted: {args.gpus}",
           "", "| conc | reqs | fail | TTFT mean / p50 / p99 (ms) | TPOT mean / p50 / p99 (ms) | ITL mean / p99 (ms) "
           "| E2E mean / p99 (ms) | tok/s/user | out tok/s | tok/s/GPU (in+out) | prefix hit (usage / metrics) |",
           "|---:|---:|---:|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(
            f"| {r['concurrency']} | {r['requests']} | {r['failed']} | {r['ttft_mean_ms']:.1f} / {r['ttft_p50_ms']:.1f} / "
            f"{r['ttft_p99_ms']:.1f} | {r['tpot_mean_ms']:.2f} / {r['tpot_p50_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
            f"{r['itl_mean_ms']:.2f} / {r['itl_p99_ms']:.2f} | {r['e2e_mean_ms']:.0f} / {r['e2e_p99_ms']:.0f} | "
            f"{r['tok_s_user']:.1f} | {r['out_tok_s']:.1f} | {r['tok_s_gpu']:.1f} | {pct(r['hit_rate'])} / "
            f"{pct(r.get('metrics_hit_rate', float('nan')))} |")
    errs = [e for r in rows for e in r["errors"]]
    if errs:
        out += ["", "Errors (first few): " + "; ".join(errs[:5])]
    out += ["", "tok/s/user = 1000 / mean TPOT; tok/s/GPU = (input + output tokens) / wall time / GPUs "
            "(on a CPU-only machine the whole machine counts as one 'GPU'). Prefix hit: cached / prompt "
            "tokens of the level's requests (usage.prompt_tokens_details.cached_tokens) / the server's "
            "v4serve_prefix_cache_hits_total / _queries_total over the level incl. its warm-up ('-': none)."]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    ap.add_argument("--model", default="", help="default: the first of /v1/models")
    ap.add_argument("--dataset", choices=["random-ids", "random-text", "shared-prefix"], default="random-ids")
    ap.add_argument("--input-len", type=int, default=1024,
                    help="prompt length (shared-prefix: the question after the system prompt)")
    ap.add_argument("--prefix-len", type=int, default=4096, help="shared-prefix: system prompt tokens")
    ap.add_argument("--num-prefixes", type=int, default=1, help="shared-prefix: distinct system prompts")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--num-prompts", type=int, default=0, help="per level; 0 = factor x concurrency")
    ap.add_argument("--num-prompts-factor", type=float, default=10.0,
                    help="prompts per level = ceil(factor x concurrency) when --num-prompts is 0 "
                         "(InferenceX: 10)")
    ap.add_argument("--warmup-output-len", type=int, default=0,
                    help="output tokens of each level's warm-up request (0 = as the first prompt)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary size; 0 = probe /detokenize")
    ap.add_argument("--token-id-low", type=int, default=1000, help="lowest random token id (skip specials)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--label", default="v4serve")
    ap.add_argument("--note", default="", help="free text for the header (server build, flags)")
    ap.add_argument("--out", default="", help="Markdown file; '-' = stdout only")
    ap.add_argument("--json-out", default="", help="also write raw rows as JSON")
    args = ap.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/")
    with httpx.Client(timeout=60) as c:
        models = c.get(base + "/v1/models", headers=headers).json()["data"]
        model = args.model or models[0]["id"]
        max_len = models[0].get("max_model_len", 0)
        vocab = args.vocab
        if not vocab:
            # Largest id that /detokenize accepts (binary search; the server answers 400 outside).
            lo, hi = 1, 1 << 20
            while lo < hi:
                mid = (lo + hi + 1) // 2
                r = c.post(base + "/detokenize", headers=headers, json={"tokens": [mid - 1]})
                lo, hi = (mid, hi) if r.status_code == 200 else (lo, mid - 1)
            vocab = lo
        token_low = min(args.token_id_low, max(0, vocab // 4))

        def detok(ids):
            return c.post(base + "/detokenize", headers=headers, json={"tokens": ids}).json()["prompt"]

        args.token_id_low = token_low
        rng = random.Random(args.seed)
        systems = make_system_prompts(args, vocab) if args.dataset == "shared-prefix" else None
        url = base + "/v1/completions"
        rows = []
        for conc in args.concurrency:
            n = args.num_prompts or max(1, int(-(-args.num_prompts_factor * conc // 1)))
            prompts = make_prompts(args, n, rng, vocab, detok, systems)
            before = scrape_metrics(c, base, headers)
            # Warm-up: one request (its prompt; --warmup-output-len tokens when given).
            warm = [(prompts[0][0], prompts[0][1], args.warmup_output_len or prompts[0][2])]
            asyncio.run(run_level(args, url, headers, model, warm, 1))
            results, wall = asyncio.run(run_level(args, url, headers, model, prompts, conc))
            after = scrape_metrics(c, base, headers)
            row = summarize(results, wall, conc, args.gpus)
            d = {k: after.get(k, 0.0) - before.get(k, 0.0)
                 for k in ("v4serve_prefix_cache_hits_total", "v4serve_prefix_cache_queries_total")}
            if after and d["v4serve_prefix_cache_queries_total"] > 0:
                row["metrics_hit_rate"] = d["v4serve_prefix_cache_hits_total"] / d["v4serve_prefix_cache_queries_total"]
                row["metrics_hit_tokens"] = d["v4serve_prefix_cache_hits_total"]
                row["metrics_query_tokens"] = d["v4serve_prefix_cache_queries_total"]
            rows.append(row)
            print(f"concurrency {conc}: {row['requests'] - row['failed']}/{row['requests']} ok, "
                  f"TTFT {row['ttft_mean_ms']:.1f} ms, TPOT {row['tpot_mean_ms']:.2f} ms, "
                  f"{row['tok_s_gpu']:.1f} tok/s/GPU, prefix hit {pct(row['hit_rate'])}", file=sys.stderr)
    server_info = f"{base} (context {max_len}, vocab {vocab})"
    md = markdown(rows, args, model, server_info)
    print(md)
    if args.out != "-":
        path = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results",
                                        f"serving-{dt.date.today().isoformat()}-{args.label}.md")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(md)
        print(f"wrote {os.path.normpath(path)}", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    failed = sum(r["failed"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
