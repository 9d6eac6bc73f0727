#!/usr/bin/env python3
"""The 8K-in / 1K-out concurrency sweep of issue 8, split over several device calls.

`run`: against a running server, runs bench_serving.py once per concurrency level of --levels
and writes ONE part file (--out-dir/sweep-part-<part>.json) after every level, so whatever a
call finishes before it is stopped still comes back. A part records the call: date, commit,
GPU, the command that ran, the server command line, the layer count, which levels were asked
for, which finished and which were skipped. Before a level starts, its time is predicted (a
simple model from bench-v4flash-20l-after.md, scaled by what the levels already run in this
call measured); a level predicted to pass --deadline is skipped and listed as such, so a call
never runs into the device's time limit in the middle of a level.

`merge`: no server, no GPU. Reads any number of part files (from different calls) and writes
one Markdown table (all levels, sorted by concurrency; when a level ran in several parts the
newest wins) with GPU busy/idle per level, SGLang's published 4xH200 V4-Flash points scaled to
the layer count, and every call's command, commit and date; plus the PNG plot
(plot_sweep.py; skipped with a note when matplotlib is missing).

  python3 bench/serving/sweep_parts.py run --base-url http://127.0.0.1:30111 --levels 1 2 4 \
      --layers 8 --part a --out-dir out
  python3 bench/serving/sweep_parts.py merge out/sweep-part-*.json --layers 8 \
      --out-md bench/results/sweep-v4flash-8l.md --out-png bench/results/sweep-v4flash-8l.png
"""
import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# SGLang DeepSeek-V4 cookbook (v0.5.15, 4xH200, V4-Flash FP8, 8K in / 1K out, 43 layers):
# (concurrency, tok/s/user or None, tok/s/GPU). Kept in one place: plot_sweep.py imports it.
from plot_sweep import SGLANG  # noqa: E402


def scrape(base):
    """Numeric samples of /metrics ({} when unreachable)."""
    try:
        txt = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    except OSError:
        return {}
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


def predict_level_s(c, layers, in_len, out_len, factor, fast_decode):
    """Seconds a level is expected to take on one H200 (bench-v4flash-20l-after.md: prefill
    3452 tok/s at 20 layers, decode 8.45 ms/step at B=1 and 189 ms at B=64, linear in between;
    `fast_decode`: the B-proportional part 3x faster for B >= 16). Includes the warm-up request
    (prompt + 16 tokens). Per-layer scaling; the head (lm_head, sampling) does not scale."""
    n = max(1, int(-(-factor * c // 1)))
    in_mean = 0.9 * in_len
    prefill_tok_s = 3400.0 * 20 / layers

    def step_ms(b):
        prop = 2.87 * (b - 1)
        if fast_decode and b >= 16:
            prop /= 3
        fixed = 0.37 + 0.043 * b
        return fixed + layers / 20 * (8.45 + prop - fixed)

    waves = -(-n // c)
    return (n + 1) * in_mean / prefill_tok_s + waves * out_len * step_ms(c) / 1000 + 16 * step_ms(1) / 1000


def git_commit():
    c = os.environ.get("V4_COMMIT", "")
    if c and c != "unknown":
        return c
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        return "no GPU (nvidia-smi not found)"


def cmd_run(a):
    base = a.base_url.rstrip("/")
    os.makedirs(a.out_dir, exist_ok=True)
    path = os.path.join(a.out_dir, f"sweep-part-{a.part}.json")
    server_cmd = ""
    if a.server_command_file and os.path.exists(a.server_command_file):
        server_cmd = open(a.server_command_file).read().strip().splitlines()[-1]
        server_cmd = server_cmd[len("server: "):] if server_cmd.startswith("server: ") else server_cmd
    part = {"meta": {"part": a.part, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     "commit": git_commit(), "gpu": gpu_name(), "command": a.command or " ".join(sys.argv),
                     "server": server_cmd, "layers": a.layers, "input_len": a.input_len, "output_len": a.output_len,
                     "factor": a.factor, "levels_asked": a.levels, "levels_done": [], "levels_skipped": [],
                     "note": a.note},
            "rows": [], "gpu": []}

    def save():
        with open(path + ".tmp", "w") as f:
            json.dump(part, f, indent=1)
        os.replace(path + ".tmp", path)

    save()
    ratio = 1.0  # measured / predicted of the latest level run in this call
    for c in a.levels:
        remaining = a.deadline - time.time() if a.deadline else float("inf")
        base_pred = predict_level_s(c, a.layers, a.input_len, a.output_len, a.factor, a.fast_decode)
        pred = base_pred * ratio
        if pred + a.margin > remaining:
            msg = f"predicted {pred:.0f} s, {remaining:.0f} s left before the deadline"
            print(f"concurrency {c}: skipped ({msg})", flush=True)
            part["meta"]["levels_skipped"].append({"concurrency": c, "why": msg})
            save()
            continue
        before = scrape(base)
        t0 = time.time()
        md, js = os.path.join(a.out_dir, f"sweep-c{c}.md"), os.path.join(a.out_dir, f"sweep-c{c}.json")
        cmd = [sys.executable, os.path.join(HERE, "bench_serving.py"), "--base-url", base,
               "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--concurrency", str(c),
               "--num-prompts-factor", str(a.factor), "--warmup-output-len", "16", "--label", f"{a.label}-c{c}",
               "--note", a.note, "--out", md, "--json-out", js, "--timeout", "1800"]
        timeout = max(10.0, remaining - 10) if a.deadline else None
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            err = r.stderr[-600:]
        except subprocess.TimeoutExpired:
            err = "bench_serving.py passed the deadline and was stopped"
        print(err, flush=True)
        wall = time.time() - t0
        after = scrape(base)
        try:
            rows = json.load(open(js))
        except (OSError, ValueError) as e:
            rows = []
            part["meta"]["levels_skipped"].append({"concurrency": c, "why": f"no result: {e}; {err[-200:]}"})
        d = lambda k: after.get(k, 0.0) - before.get(k, 0.0)  # noqa: E731
        for row in rows:
            row["part"] = a.part
            row["wall_level_s"] = wall
            row["predicted_s"] = pred
            part["rows"].append(row)
        if rows:
            part["meta"]["levels_done"].append(c)
            part["gpu"].append({"concurrency": c, "steps": d("v4serve_gpu_steps_total"),
                                "busy_s": d("v4serve_gpu_busy_seconds_total"),
                                "idle_s": d("v4serve_gpu_idle_seconds_total"),
                                "decode_steps": d("v4serve_gpu_decode_steps_total"),
                                "decode_idle_s": d("v4serve_gpu_decode_idle_seconds_total"), "wall_s": wall,
                                "part": a.part})
            # The latest (largest) level says most about the next one; small levels carry fixed costs.
            ratio = min(3.0, max(0.7, wall / max(1e-9, base_pred)))
        save()
    print(f"wrote {path}: levels done {part['meta']['levels_done']}, skipped "
          f"{[s['concurrency'] for s in part['meta']['levels_skipped']]}", flush=True)
    return 0


def fmt_num(x, spec):
    return "-" if x is None or x != x else format(x, spec)


def merge(parts, layers, title):
    """Merged rows / gpu rows (newest part wins per level) and the Markdown text."""
    parts = sorted(parts, key=lambda p: p["meta"]["date"])
    rows, gpu = {}, {}
    for p in parts:
        for r in p["rows"]:
            rows[r["concurrency"]] = r
        for g in p["gpu"]:
            gpu[g["concurrency"]] = g
    rows = [rows[c] for c in sorted(rows)]
    f = 43.0 / layers
    out = [f"# {title}", "",
           f"One table from {len(parts)} device call(s) (bench/serving/sweep_parts.py merge); a level run in "
           "several calls shows the newest.", "", "## Calls", ""]
    for p in parts:
        m = p["meta"]
        skipped = ", ".join(f"{s['concurrency']} ({s['why']})" for s in m["levels_skipped"]) or "none"
        out += [f"- part `{m['part']}`: {m['date']}, commit {m['commit']}, GPU {m['gpu']}",
                f"  - command: `{m['command']}`",
                f"  - server: `{m['server']}`",
                f"  - {m['layers']} layers, input {m['input_len']} / output {m['output_len']} (uniform in [0.8 L, L]), "
                f"{m['factor']} x concurrency prompts per level; levels asked {m['levels_asked']}, done "
                f"{m['levels_done']}, skipped: {skipped}"]
    missing = sorted({c for p in parts for c in p["meta"]["levels_asked"]} - {r["concurrency"] for r in rows})
    if missing:
        out += ["", f"**Levels without a result: {missing}.**"]
    out += ["", "## Results", "",
            "| conc | reqs | fail | TTFT mean / p99 (ms) | TPOT mean / p99 (ms) | tok/s/user | out tok/s | "
            "tok/s/GPU (in+out) | part |", "|---:|---:|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['concurrency']} | {r['requests']} | {r['failed']} | {r['ttft_mean_ms']:.1f} / "
                   f"{r['ttft_p99_ms']:.1f} | {r['tpot_mean_ms']:.2f} / {r['tpot_p99_ms']:.2f} | "
                   f"{fmt_num(r['tok_s_user'], '.1f')} | {r['out_tok_s']:.1f} | {r['tok_s_gpu']:.1f} | {r.get('part', '')} |")
    out += ["", f"## Against SGLang's published numbers (4xH200, 43 layers) scaled by 43/{layers}", "",
            "| SGLang conc | SGLang tok/s/user (scaled) | SGLang tok/s/GPU (scaled) | ours at that conc: tok/s/user | "
            "ours: tok/s/GPU | ours / SGLang per GPU |", "|---:|---:|---:|---:|---:|---:|"]
    by_c = {r["concurrency"]: r for r in rows}
    for c, u, g in SGLANG:
        ours = by_c.get(c)
        su = None if u is None else u * f
        out.append(f"| {c} | {fmt_num(su, '.0f')} | {g * f:.0f} | "
                   f"{fmt_num(ours['tok_s_user'] if ours else None, '.1f')} | "
                   f"{fmt_num(ours['tok_s_gpu'] if ours else None, '.0f')} | "
                   f"{fmt_num(ours['tok_s_gpu'] / (g * f) if ours else None, '.2f')} |")
    out += ["", "Scaling by 43/layers is rough: it ignores the embedding / lm_head share, SGLang's MTP (3 drafted "
            "tokens) at concurrency 1, and that SGLang spreads one full model over 4 GPUs.", "",
            "## GPU busy / idle between steps (/metrics v4serve_gpu_* deltas per level)", "",
            "| concurrency | steps | GPU busy (s) | GPU idle between steps (s) | idle / step (us) | decode steps | "
            "idle / decode step (us) | wall (s) |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in sorted(gpu):
        g = gpu[c]
        out.append(f"| {c} | {g['steps']:.0f} | {g['busy_s']:.2f} | {g['idle_s']:.2f} | "
                   f"{1e6 * g['idle_s'] / max(g['steps'], 1):.0f} | {g['decode_steps']:.0f} | "
                   f"{1e6 * g['decode_idle_s'] / max(g['decode_steps'], 1):.0f} | {g['wall_s']:.0f} |")
    return rows, "\n".join(out) + "\n"


def cmd_merge(a):
    parts = []
    for p in a.parts:
        with open(p) as f:
            parts.append(json.load(f))
    if not parts:
        print("no part files", file=sys.stderr)
        return 2
    layers = a.layers or parts[0]["meta"]["layers"]
    if any(p["meta"]["layers"] != layers for p in parts):
        print(f"parts disagree on the layer count: {[p['meta']['layers'] for p in parts]}", file=sys.stderr)
        return 2
    title = a.title or f"8K in / 1K out concurrency sweep, V4-Flash-shaped dummy model ({layers} of 43 layers), 1xH200"
    rows, md = merge(parts, layers, title)
    if a.out_png:
        rows_path = (a.out_png[:-4] if a.out_png.endswith(".png") else a.out_png) + "-rows.json"
        with open(rows_path, "w") as f:
            json.dump(rows, f, indent=1)
        try:
            import matplotlib  # noqa: F401
            r = subprocess.run([sys.executable, os.path.join(HERE, "plot_sweep.py"), rows_path, "--out", a.out_png,
                                "--scale-layers", str(layers)], capture_output=True, text=True)
            md += "\n" + (f"Plot: `{os.path.basename(a.out_png)}` (tok/s/GPU against tok/s/user; rows in "
                          f"`{os.path.basename(rows_path)}`).\n" if r.returncode == 0 else
                          f"Plot failed: {r.stderr[-300:]}\n")
        except ImportError:
            md += f"\nNo plot: matplotlib is not installed here (rows in `{os.path.basename(rows_path)}`; " \
                  f"`python3 bench/serving/plot_sweep.py {rows_path} --out {a.out_png} --scale-layers {layers}`).\n"
    with open(a.out_md, "w") as f:
        f.write(md)
    print(md)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--base-url", required=True)
    r.add_argument("--levels", type=int, nargs="+", required=True)
    r.add_argument("--layers", type=int, required=True)
    r.add_argument("--part", required=True, help="name of this call's part (file sweep-part-<part>.json)")
    r.add_argument("--out-dir", required=True)
    r.add_argument("--input-len", type=int, default=8192)
    r.add_argument("--output-len", type=int, default=1024)
    r.add_argument("--factor", type=float, default=1.0)
    r.add_argument("--label", default="v4flash")
    r.add_argument("--note", default="")
    r.add_argument("--command", default="", help="the command line to record (default: this one)")
    r.add_argument("--server-command-file", default="")
    r.add_argument("--deadline", type=float, default=0, help="epoch seconds; 0 = none")
    r.add_argument("--margin", type=float, default=20, help="seconds kept free before the deadline")
    r.add_argument("--fast-decode", action="store_true", help="predict with the 3x faster B>=16 decode")
    m = sub.add_parser("merge")
    m.add_argument("parts", nargs="+")
    m.add_argument("--layers", type=int, default=0)
    m.add_argument("--out-md", required=True)
    m.add_argument("--out-png", default="")
    m.add_argument("--title", default="")
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_merge(a)


if __name__ == "__main__":
    sys.exit(main())
