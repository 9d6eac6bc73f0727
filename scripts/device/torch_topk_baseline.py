"""torch.topk baseline for bench/results/cuda-topk.md (runs on the device, in the same run as
bench_kernels). Top-512 of n f32 scores, batch 1 and 64, CUDA events, median of 200 launches,
L2-warm (same buffer) like the 'warm' column of bench_kernels, timed like it: events around 10
back-to-back calls, per-call time, median of 40 samples. Usage: python3 torch_topk_baseline.py OUT.md"""
import sys

import torch

out = sys.argv[1]
k = 512
rows = []
torch.manual_seed(0)
for batch in (1, 64):
    for n in (8192, 65536, 131072, 262144):
        x = torch.randn(batch, n, device="cuda", dtype=torch.float32)
        for _ in range(20):
            torch.topk(x, k, dim=-1, sorted=False)
        torch.cuda.synchronize()
        times = []
        for _ in range(40):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                torch.topk(x, k, dim=-1, sorted=False)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1000.0 / 10)
        times.sort()
        rows.append((n, batch, times[len(times) // 2], times[len(times) // 10], times[len(times) * 9 // 10]))
        print(f"torch.topk n={n} batch={batch}: {rows[-1][2]:.2f} us", flush=True)
with open(out, "w") as f:
    f.write(f"# torch.topk baseline (torch {torch.__version__}, {torch.cuda.get_device_name()})\n\n")
    f.write("| n | batch | torch.topk(k=512, sorted=False) µs median (p10–p90) |\n|---:|---:|---:|\n")
    for n, b, m, p10, p90 in rows:
        f.write(f"| {n} | {b} | {m:.2f} ({p10:.2f}–{p90:.2f}) |\n")
