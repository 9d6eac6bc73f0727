#!/usr/bin/env python3
"""Summary table of the ratio stage (scripts/device/issue7_run.sh): reads the TSV the stage writes
(kv spec, attention variant, run, context, ms/step median, tok/s; one line per decode row) and
prints, per (kv spec, variant), each run's 4K and 900K medians and its 900K / 4K tok/s ratio, then
the min, mean and max of the ratio and how many runs reach 0.95 (the issue-7 target)."""
import sys
from collections import OrderedDict


def main(path):
    runs = OrderedDict()  # (kv, variant) -> {run: {context: (ms, tok_s)}}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 6:
                continue
            kv, av, rep, ctx, ms, tok_s = parts
            try:
                runs.setdefault((kv, av), OrderedDict()).setdefault(rep, {})[int(ctx)] = (
                    float(ms), float(tok_s))
            except ValueError:
                continue
    print("# 900K vs 4K decode at batch 1, as served: summary of the runs below\n")
    print("| KV spec | V4_ATTN_DEC | run | 4K ms/step | 900K ms/step | 900K / 4K tok/s |")
    print("|---|---|---:|---:|---:|---:|")
    totals = []
    for (kv, av), reps in runs.items():
        ratios = []
        for rep, by_ctx in reps.items():
            if len(by_ctx) != 2:
                print(f"| {kv} | {av} | {rep} | — | — | (a context is missing) |")
                continue
            lo, hi = min(by_ctx), max(by_ctx)
            r = by_ctx[hi][1] / by_ctx[lo][1]
            ratios.append(r)
            print(f"| {kv} | {av} | {rep} | {by_ctx[lo][0]:.2f} | {by_ctx[hi][0]:.2f} | {r:.3f} |")
        if ratios:
            totals.append((kv, av, ratios))
    print()
    for kv, av, ratios in totals:
        print(f"- {kv}, V4_ATTN_DEC={av}: {len(ratios)} runs, 900K / 4K = {min(ratios):.3f}–"
              f"{max(ratios):.3f}, mean {sum(ratios) / len(ratios):.3f}; "
              f"{sum(r >= 0.95 for r in ratios)} of {len(ratios)} ≥ 0.95")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ratio_summary.py SUMMARY.tsv")
    main(sys.argv[1])
