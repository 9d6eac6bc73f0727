#!/usr/bin/env python3
"""Host simulation of attention_dec variant 6's softmax bookkeeping against variant 5's.

Numpy, no GPU. Both see the same bf16-rounded q and k (as the kernels do); per 32-key tile:
  v5: running max m (natural units), p = exp(s - m), o += bf16(p) @ V, l += sum(p) (fp32 p),
      o and l rescaled whenever m grows;
  v6: reference max m2 in log2 units that moves only when a tile max exceeds it by more than 8
      (all heads at once, like the warp vote), p = 2^(s * log2e - m2), o += bf16(p) @ V,
      l += sum(bf16(p)) (P * ones on the tensor cores), m = m2 * ln 2 at the end; masked keys,
      skipped empty tiles, splits merged with the sink as the combine kernel does.
Prints each variant's max error relative to max |exact| and v6 vs v5, and asserts the bounds the
GPU tests use (CudaAttentionDec.Variant6*: vs exact 1e-2, v6 vs v5 5e-3). Usage:
  python3 scripts/attn_dec6_simulate.py
"""
import numpy as np

rng = np.random.default_rng(2)
HD = 512


def bf16(x):
    """Round to bf16 (nearest even), returned as float64."""
    x = np.ascontiguousarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def simulate(n, heads, q_std, splits, mask=None, sink_shift=0.0, tau=8.0):
    q = bf16(rng.standard_normal((heads, HD)) * q_std)
    k = bf16(rng.standard_normal((n, HD)) * 0.3)
    sinks = rng.standard_normal(heads) + sink_shift
    valid = np.ones(n, bool) if mask is None else ~mask
    lg = (q @ k.T) / np.sqrt(HD)  # heads × n logits (natural units)
    # Exact: softmax over the valid keys and the sink.
    lv = np.where(valid, lg, -np.inf)
    mx = np.maximum(lv.max(1), sinks)
    w = np.exp(lv - mx[:, None])
    exact = (w @ k) / (w.sum(1) + np.exp(sinks - mx))[:, None]
    per = -(-(-(-n // 32)) // splits) * 32  # whole tiles per split
    out = {}
    for var in (5, 6):
        parts = []
        for s0 in range(0, n, per):
            m = np.full(heads, -np.inf)
            l = np.zeros(heads)
            o = np.zeros((heads, HD))
            for t0 in range(s0, min(n, s0 + per), 32):
                vm = valid[t0:t0 + 32]
                x = np.where(vm, lg[:, t0:t0 + 32], -np.inf)
                if var == 5:
                    mn = np.maximum(m, x.max(1))
                    corr = np.where(mn == -np.inf, 1.0, np.exp(m - mn))
                    p = np.where(vm, np.exp(x - np.where(mn == -np.inf, 0, mn)[:, None]), 0.0)
                    l = l * corr + p.sum(1)
                    o = o * corr[:, None] + bf16(p) @ k[t0:t0 + 32]
                    m = mn
                else:
                    if not vm.any():
                        continue  # the kernel skips a tile without a valid key
                    x2 = x / np.log(2)
                    if np.any(x2.max(1) > m + tau):
                        mn = np.maximum(m, x2.max(1))
                        corr = np.exp2(m - mn)
                        l *= corr
                        o *= corr[:, None]
                        m = mn
                    p = bf16(np.where(vm, np.exp2(x2 - m[:, None]), 0.0))
                    assert p.max() <= 2 ** tau * 1.01
                    l += p.sum(1)
                    o += p @ k[t0:t0 + 32]
            parts.append((m * np.log(2) if var == 6 else m, l, o))
        big_m = np.maximum.reduce([pm for pm, _, _ in parts] + [sinks])
        f = [np.where(pm == -np.inf, 0.0, np.exp(pm - big_m)) for pm, _, _ in parts]
        den = sum(fq * pl for fq, (_, pl, _) in zip(f, parts)) + np.exp(sinks - big_m)
        out[var] = sum(fq[:, None] * po for fq, (_, _, po) in zip(f, parts)) / den[:, None]
    scale = max(np.abs(exact).max(), 1e-30)
    e5 = np.abs(out[5] - exact).max() / scale
    e6 = np.abs(out[6] - exact).max() / scale
    d = np.abs(out[6] - out[5]).max() / max(np.abs(out[5]).max(), 1e-30)
    if np.abs(exact).max() == 0:
        e5, e6, d = np.abs(out[5]).max(), np.abs(out[6]).max(), np.abs(out[6]).max()
    return e5, e6, d


def main():
    np.seterr(invalid="ignore", divide="ignore")  # −inf − −inf in the masked rows' rescale
    cases = [  # (keys, heads, q std, splits, masked key range, sink shift)
        (8320, 64, 0.3, 1, None, 0), (8320, 64, 0.3, 33, None, 0), (640, 64, 0.3, 1, None, 0),
        (640, 64, 0.3, 20, None, 0), (17, 128, 0.3, 1, None, 0), (1152, 64, 0.3, 12, None, 0),
        (8320, 64, 18, 1, None, 0), (640, 128, 18, 20, None, 0), (8320, 64, 3, 33, None, 0),
        (8320, 64, 0.3, 33, (0, 96), 0), (640, 64, 0.3, 20, (0, 320), 0),
        (640, 64, 0.3, 2, (0, 640), 0), (1152, 64, 18, 4, None, 6), (1152, 64, 0.3, 4, None, -30),
    ]
    ok = True
    for n, heads, q_std, splits, mr, shift in cases:
        mask = None
        if mr:
            mask = np.zeros(n, bool)
            mask[mr[0]:mr[1]] = True
        e5, e6, d = simulate(n, heads, q_std, splits, mask, shift)
        good = e5 <= 1e-2 and e6 <= 1e-2 and d <= 5e-3
        ok &= good
        print(f"keys {n:5d} heads {heads:3d} q std {q_std:4} splits {splits:2d} mask {mr} sink "
              f"{shift:+}: v5 {e5:.2e}, v6 {e6:.2e} (vs exact), v6 vs v5 {d:.2e}"
              f"{'' if good else '  <-- over the bound'}")
    assert ok, "a bound was exceeded"
    print("ok")


if __name__ == "__main__":
    main()
