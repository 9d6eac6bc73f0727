#!/usr/bin/env python3
"""Condenses one Nsight Compute probe (scripts/device/ncu_issue7.sh) into ~40 lines.

Usage: ncu_summary.py NAME DETAILS_TXT RAW_CSV SASS_CSV CUDA_CSV
  DETAILS_TXT  `ncu --import R --page details --print-details all` output
  RAW_CSV      `ncu --import R --page raw --csv` output (one kernel)
  SASS_CSV     `ncu --import R --page source --csv --print-source sass` output
  CUDA_CSV     the same with `--print-source cuda` (needs -lineinfo and --import-source)
Prints to stdout: the headline metrics of the details page, the warp stall reasons (cycles per
issued instruction, from the raw page), the rule lines that name stalls, and the SASS
instructions / CUDA lines with the most warp-stall samples. Any missing or unreadable input is
reported in one line and skipped; the script never fails (exit code 0).
"""
import csv
import os
import re
import sys

HEADLINE = [
    "Duration", "Elapsed Cycles", "SM Frequency", "SM Active Cycles", "Memory Throughput",
    "DRAM Throughput", "Compute (SM) Throughput", "L1/TEX Hit Rate", "L2 Hit Rate",
    "Executed Ipc Active", "Issue Slots Busy", "Issued Warp Per Scheduler", "No Eligible",
    "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
    "Warp Cycles Per Issued Instruction", "Avg. Active Threads Per Warp", "Registers Per Thread",
    "Block Size", "Grid Size", "Cluster Size", "Dynamic Shared Memory Per Block",
    "Theoretical Occupancy", "Achieved Occupancy", "Local Memory Spilling Requests",
    "Executed Instructions",
]


def num(s):
    try:
        return float(str(s).replace(",", "").strip())
    except ValueError:
        return None


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        print(f"  ({path}: {e})")
        return ""


def headline(details):
    seen = set()
    out = []
    for line in details.splitlines():
        m = re.match(r"\s+(\S.*?\S)\s{2,}(\S+)?\s+(\S+)\s*$", line)
        if not m:
            continue
        name = m.group(1).strip()
        if name in HEADLINE and name not in seen:
            seen.add(name)
            unit = (m.group(2) or "").strip()
            out.append((HEADLINE.index(name), f"  {name:<36} {m.group(3):>14} {unit}"))
    for _, s in sorted(out):
        print(s)
    rules = [l.strip() for l in details.splitlines() if re.search(r"stall|bank.conflict|uncoalesced|divergen", l, re.I)]
    for r in rules[:4]:
        print("  rule: " + r[:160])


def csv_rows(text):
    lines = [l for l in text.splitlines() if l.startswith('"')]
    return list(csv.reader(lines))


def stall_reasons(raw):
    rows = csv_rows(raw)
    if len(rows) < 3:
        print("  (no raw metrics)")
        return
    head, vals = rows[0], rows[2]
    # Metric families, preferred first: cycles per issued instruction per reason
    # (WarpStateStats), then average latency, then the sampled counts (SourceCounters).
    fams = [("cycles per issued instruction", r"average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
            ("average latency", r"average_warp_latency_issue_stalled_(\w+?)\.ratio$"),
            ("samples", r"pcsamp_warps_issue_stalled_(\w+?)$")]
    for label, rx in fams:
        st = []
        for h, v in zip(head, vals):
            m = re.search(rx, h)
            x = num(v)
            if m and "not_issued" not in m.group(1) and x is not None and x > 0:
                st.append((x, m.group(1)))
        if st:
            break
    if not st:
        print("  (no stall metrics in the raw page)")
        return
    st.sort(reverse=True)
    total = sum(x for x, _ in st)
    print(f"  warp stall reasons ({label}; sum {total:.2f}):")
    for x, name in st[:8]:
        print(f"    {name:<28} {x:10.2f}  {100 * x / total:5.1f}%")


def csv_rows_ctx(text):
    """CSV rows of `text` with the last non-CSV line before each (e.g. a source file name)."""
    out, ctx = [], ""
    for line in text.splitlines():
        if line.startswith('"'):
            out.append((ctx, next(csv.reader([line]))))
        elif line.strip() and not line.startswith("=="):
            ctx = line.strip()
    return out


def top_lines(text, label, n):
    with_ctx = csv_rows_ctx(text)
    rows = [r for _, r in with_ctx]
    hi = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
    if hi is None:
        print(f"  ({label}: no warp-stall sampling columns)")
        return
    head = rows[hi]
    col = next((i for i, c in enumerate(head) if "Stall Sampling (All" in c), None)
    if col is None:
        col = next(i for i, c in enumerate(head) if "Sampling" in c)
    src = next((i for i, c in enumerate(head) if c.strip() == "Source"), 1 if len(head) > 1 else 0)
    key = 0  # first column: address (SASS) or line number (CUDA)
    data = [r + [os.path.basename(c)[-24:]] for c, r in with_ctx[hi + 1:]
            if len(r) == len(head) and num(r[col]) is not None]
    total = sum(num(r[col]) for r in data) or 1.0
    # per-row extra: the stall-reason columns (if the page has them) with the largest values
    reason_cols = [i for i, c in enumerate(head) if re.search(r"stall", c, re.I) and i != col
                   and "Sampling" not in c]
    data.sort(key=lambda r: -num(r[col]))
    print(f"  top {label} by warp-stall samples ({head[col]}, total {total:.0f}):")
    for r in data[:n]:
        extra = ""
        if reason_cols:
            rs = sorted(((num(r[i]) or 0, head[i]) for i in reason_cols), reverse=True)[:2]
            parts = [f"{h} {v:.0f}" for v, h in rs if v > 0]
            extra = "  [" + ", ".join(parts) + "]" if parts else ""
        s = re.sub(r"\s+", " ", r[src]).strip()[:90]
        where = f"{r[-1]}:" if r[-1] else ""
        print(f"    {where}{r[key]:>6} {100 * num(r[col]) / total:5.1f}%  {s}{extra}")


def main():
    if len(sys.argv) != 6:
        print(__doc__)
        return 0
    name, det, raw, sass, cuda = sys.argv[1:]
    print(f"### {name}")
    for part in (lambda: headline(read_text(det)),
                 lambda: stall_reasons(read_text(raw)),
                 lambda: top_lines(read_text(cuda), "CUDA lines", 8),
                 lambda: top_lines(read_text(sass), "SASS instructions", 10)):
        try:
            part()
        except Exception as e:  # a summary must not stop the script
            print(f"  (summary error: {type(e).__name__}: {e})")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
