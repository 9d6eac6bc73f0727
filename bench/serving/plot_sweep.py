#!/usr/bin/env python3
"""Plots a concurrency sweep (bench_serving.py --json-out rows): tok/s/GPU against tok/s/user,
next to SGLang's published V4-Flash points on 4xH200 (docs: ../shared/design/performance.md),
optionally scaled to a layer-truncated model (--scale-layers N: SGLang's tok/s x 43/N, a rough
per-layer scaling that ignores embedding/lm_head cost and SGLang's MTP at concurrency 1).

  python3 bench/serving/plot_sweep.py rows.json --out bench/results/x.png --scale-layers 20
Needs matplotlib (pip install matplotlib).
"""
import argparse
import json

# SGLang DeepSeek-V4 cookbook table (v0.5.15, 4xH200, V4-Flash FP8, 8K in / 1K out):
# (concurrency, tok/s/user or None, tok/s/GPU).
SGLANG = [(1, 305.0, 631.0), (16, 111.0, 3302.0), (64, None, 3098.0), (1024, None, 3958.0)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale-layers", type=int, default=43)
    ap.add_argument("--title", default="v4serve, V4-Flash-shaped dummy model, 8K in / 1K out")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = json.load(open(args.rows))
    f = 43.0 / args.scale_layers
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [r["tok_s_user"] for r in rows]
    ys = [r["tok_s_gpu"] for r in rows]
    ax.plot(xs, ys, "o-", label=f"v4serve, 1xH200, {args.scale_layers} layers")
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(str(r["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    pts = [(c, u * f, g * f) for c, u, g in SGLANG if u is not None]
    ax.plot([p[1] for p in pts], [p[2] for p in pts], "s--",
            label=f"SGLang 4xH200 (published) x 43/{args.scale_layers}")
    for c, x, y in pts:
        ax.annotate(f"SGLang c={c}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("tok/s/user (1000 / TPOT)")
    ax.set_ylabel("tok/s/GPU (input + output)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
