#!/usr/bin/env python3
"""Host emulation of attn_dec5_kernel's fragment index math (one tile, exact arithmetic).

Checks tile_qk5 (Q A-fragments by ldmatrix.x4 from qs, K B-fragments by ldmatrix.x4 over 4 dim
groups), the 8 S slots (16 x 8, stride kSx5Ld = 8) and their gather (half 0 + half 1 per n-tile),
and tile_pv_w<64> (P from the gathered S, V by ldmatrix.x4.trans, warp = 64-dim part) against
numpy: S = Q K^T, O = P V. Layouts: PTX ISA, mma.m16n8k16 (bf16) and ldmatrix fragments.
"""
import numpy as np

LDB = 520  # kLdB (elements)
rng = np.random.default_rng(1)
Q = rng.standard_normal((16, 512))
K = rng.standard_normal((32, 512))
qs = np.zeros(16 * LDB); kt = np.zeros(32 * LDB)
for h in range(16): qs[h * LDB:h * LDB + 512] = Q[h]
for k in range(32): kt[k * LDB:k * LDB + 512] = K[k]


def ldmatrix_x4(mem, addr_of_lane, trans=False):
    """addr_of_lane(l) = element offset of row (l % 8) of matrix l // 8; returns frag[lane][i] =
    (lo, hi) element pair of matrix i."""
    rows = [[addr_of_lane(8 * m + r) for r in range(8)] for m in range(4)]
    out = [[None] * 4 for _ in range(32)]
    for T in range(32):
        for m in range(4):
            if not trans:
                base = rows[m][T // 4] + 2 * (T % 4)
                out[T][m] = (mem[base], mem[base + 1])
            else:  # element (row 2(T%4) + j, col T//4)
                out[T][m] = (mem[rows[m][2 * (T % 4)] + T // 4], mem[rows[m][2 * (T % 4) + 1] + T // 4])
    return out


def mma(acc, a, b0, b1):
    """acc[lane][4] += A(16x16) B(16x8) with per-lane fragments a[lane][4] pairs, b0/b1[lane] pairs."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for T in range(32):
        g, tq = T // 4, T % 4
        for j in range(2):
            A[g, 2 * tq + j] = a[T][0][j]; A[g + 8, 2 * tq + j] = a[T][1][j]
            A[g, 2 * tq + 8 + j] = a[T][2][j]; A[g + 8, 2 * tq + 8 + j] = a[T][3][j]
            B[2 * tq + j, g] = b0[T][j]; B[2 * tq + 8 + j, g] = b1[T][j]
    C = A @ B
    for T in range(32):
        g, tq = T // 4, T % 4
        acc[T][0] += C[g, 2 * tq]; acc[T][1] += C[g, 2 * tq + 1]
        acc[T][2] += C[g + 8, 2 * tq]; acc[T][3] += C[g + 8, 2 * tq + 1]


sx = np.full(8 * 16 * 8, np.nan)
for warp in range(8):
    kn, dh = warp >> 1, warp & 1
    qf = [ldmatrix_x4(qs, lambda l, i=i: dh * 256 + (l & 15) * LDB + 16 * i + 8 * (l >> 4))
          for i in range(16)]
    kw = (8 * kn) * LDB + 256 * dh
    acc = [[[0.0] * 4 for _ in range(32)] for _ in range(4)]
    for j in range(8):
        bf = ldmatrix_x4(kt, lambda l: kw + (l & 7) * LDB + 8 * (l >> 3) + 32 * j)
        mma(acc[(2 * j) & 3], qf[2 * j], [bf[T][0] for T in range(32)], [bf[T][1] for T in range(32)])
        mma(acc[(2 * j + 1) & 3], qf[2 * j + 1], [bf[T][2] for T in range(32)], [bf[T][3] for T in range(32)])
    for T in range(32):
        g, tq = T // 4, T % 4
        c = [(acc[0][T][e] + acc[1][T][e]) + (acc[2][T][e] + acc[3][T][e]) for e in range(4)]
        mine = warp * 16 * 8
        sx[mine + g * 8 + 2 * tq], sx[mine + g * 8 + 2 * tq + 1] = c[0], c[1]
        sx[mine + (g + 8) * 8 + 2 * tq], sx[mine + (g + 8) * 8 + 2 * tq + 1] = c[2], c[3]
assert not np.isnan(sx).any(), "a slot element was never written"

S_ref = Q @ K.T
P = rng.standard_normal((16, 32))  # stand-in p values (the softmax is elementwise per row)
O = np.zeros((16, 512))
for warp in range(8):
    sv = [[[0.0] * 4 for _ in range(4)] for _ in range(32)]
    for T in range(32):
        g, tq = T // 4, T % 4
        for nt in range(4):
            s0, s1 = (2 * nt) * 128, (2 * nt + 1) * 128
            got = [sx[s0 + g * 8 + 2 * tq] + sx[s1 + g * 8 + 2 * tq],
                   sx[s0 + g * 8 + 2 * tq + 1] + sx[s1 + g * 8 + 2 * tq + 1],
                   sx[s0 + (g + 8) * 8 + 2 * tq] + sx[s1 + (g + 8) * 8 + 2 * tq],
                   sx[s0 + (g + 8) * 8 + 2 * tq + 1] + sx[s1 + (g + 8) * 8 + 2 * tq + 1]]
            c0 = nt * 8 + 2 * tq
            want = [S_ref[g, c0], S_ref[g, c0 + 1], S_ref[g + 8, c0], S_ref[g + 8, c0 + 1]]
            assert np.allclose(got, want), (warp, T, nt, got, want)
            sv[T][nt] = [P[g, c0], P[g, c0 + 1], P[g + 8, c0], P[g + 8, c0 + 1]]
    # tile_pv_w<64>(kt + warp * 64): o[np2][4] over dims warp*64 + 8*np2 + 2tq (+1)
    o = [[[0.0] * 4 for _ in range(32)] for _ in range(8)]
    kwv = warp * 64
    for ks in range(2):
        af = [[(sv[T][2 * ks][0], sv[T][2 * ks][1]), (sv[T][2 * ks][2], sv[T][2 * ks][3]),
               (sv[T][2 * ks + 1][0], sv[T][2 * ks + 1][1]), (sv[T][2 * ks + 1][2], sv[T][2 * ks + 1][3])]
              for T in range(32)]
        for np_ in range(4):
            bf = ldmatrix_x4(kt, lambda l: kwv + (16 * ks + (l & 7) + 8 * ((l >> 3) & 1)) * LDB
                             + 8 * (l >> 4) + 16 * np_, trans=True)
            mma(o[2 * np_], af, [bf[T][0] for T in range(32)], [bf[T][1] for T in range(32)])
            mma(o[2 * np_ + 1], af, [bf[T][2] for T in range(32)], [bf[T][3] for T in range(32)])
    for T in range(32):
        g, tq = T // 4, T % 4
        for nt in range(8):  # store_out_w<64>: dims part*64 + nt*8 + 2tq (+1)
            d = warp * 64 + nt * 8 + 2 * tq
            O[g, d], O[g, d + 1], O[g + 8, d], O[g + 8, d + 1] = o[nt][T]
assert np.allclose(O, P @ K), np.abs(O - P @ K).max()
print("attn_dec5 fragment math: S and O match numpy")
