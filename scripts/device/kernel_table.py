#!/usr/bin/env python3
"""Per-kernel device time of one profiled step, as Markdown (issue7_run.sh stage pfkern).

Usage: kernel_table.py TITLE RAW_CSV
  RAW_CSV  `ncu --import R --page raw --csv` with the metrics gpu__time_duration.sum,
           launch__grid_size, launch__block_size, launch__registers_per_thread (ncu ran with
           --profile-from-start off around one step: v4serve bench V4_BENCH_PROFILER)
Prints: the total, the kernels grouped by name (count, µs, share; largest first) and every launch
in order. Kernels run serialised under ncu, so the total is the step's kernel time without
overlap or launch gaps. Never fails: an unreadable input gives one line and exit code 0.
"""
import csv
import re
import sys


def short_name(full):
    """`void ns::(anonymous namespace)::k<T, 4>(args)` -> `k<T, 4>`; cuBLAS names stay whole."""
    s = full.strip()
    # Drop the parameter list: the last top-level '(' … ')'.
    depth = 0
    cut = len(s)
    for i, ch in enumerate(s):
        if ch == '<':
            depth += 1
        elif ch == '>':
            depth -= 1
        elif ch == '(' and depth == 0 and not s.startswith('(anonymous', i):
            cut = i
            break
    s = s[:cut]
    s = re.sub(r'^void\s+', '', s)
    s = s.replace('(anonymous namespace)::', '').replace('<unnamed>::', '')
    # Keep the last qualified component (the template arguments as written).
    head = s.split('<', 1)
    base = head[0].split('::')[-1]
    s = base + ('<' + head[1] if len(head) > 1 else '')
    s = re.sub(r'v4::(cuda::)?', '', s)
    return s if len(s) <= 110 else s[:107] + "..."


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return
    title, path = sys.argv[1], sys.argv[2]
    try:
        with open(path, newline='') as f:
            rows = list(csv.reader(f))
    except OSError as e:
        print(f"kernel_table: cannot read {path}: {e}")
        return
    hdr = None
    scale = None  # gpu__time_duration unit -> µs (the row after the header names the units)
    launches = []
    for r in rows:
        if hdr is None:
            if 'Kernel Name' in r and 'gpu__time_duration.sum' in r:
                hdr = {k: i for i, k in enumerate(r)}
            continue
        if scale is None:
            unit = r[hdr['gpu__time_duration.sum']].strip() if len(r) > len(hdr) - 1 else ''
            scale = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3,
                     'msecond': 1e3, 's': 1e6, 'second': 1e6}.get(unit)
            if scale is None:
                print(f"kernel_table: unknown time unit '{unit}' in {path}")
                return
            continue
        if len(r) < len(hdr) or not r[hdr['ID']].strip().isdigit():
            continue
        def get(k, default=''):
            i = hdr.get(k)
            return r[i] if i is not None and i < len(r) else default
        try:
            us = float(get('gpu__time_duration.sum').replace(',', '')) * scale
        except ValueError:
            continue
        launches.append({
            'name': short_name(get('Kernel Name')),
            'us': us,
            'grid': get('launch__grid_size') or get('Grid Size'),
            'block': get('launch__block_size') or get('Block Size'),
            'regs': get('launch__registers_per_thread'),
        })
    print(f"## {title}\n")
    if not launches:
        print(f"kernel_table: no kernel rows in {path}\n")
        return
    total = sum(l['us'] for l in launches)
    print(f"{len(launches)} launches, {total:.1f} µs of kernel time "
          f"(gpu__time_duration, serialised under ncu, clocks and caches left alone).\n")
    groups = {}
    for l in launches:
        g = groups.setdefault(l['name'], [0, 0.0])
        g[0] += 1
        g[1] += l['us']
    print("| kernel | launches | µs | µs / launch | share |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{name}` | {n} | {us:.1f} | {us / n:.2f} | {100 * us / total:.1f}% |")
    print("\n<details><summary>every launch in order</summary>\n")
    print("| # | kernel | grid | block | regs | µs |")
    print("|---:|---|---:|---:|---:|---:|")
    for i, l in enumerate(launches):
        print(f"| {i} | `{l['name']}` | {l['grid']} | {l['block']} | {l['regs']} | {l['us']:.2f} |")
    print("\n</details>\n")


if __name__ == '__main__':
    main()
