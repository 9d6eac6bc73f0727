#!/usr/bin/env python3
"""Host simulation of the index math of indexer_decode_wg_kernel (src/ops/cuda/indexer.cu,
indexer_scores_tc variants 8 / 9; docs/cuda.md §Warpgroup-MMA decode kernel), no GPU needed:

1. the epilogue: the wgmma m64nN f32 accumulator fragment (PTX ISA: warp w rows 16w..16w+15,
   lane (g, t): d[4j + e] = (row g, col 8j + 2t + e), d[4j + 2 + e] = (row g + 8, same col)),
   ReLU · w over the two heads, the xor-16 / 8 / 4 halving butterfly and the 4-warp partial sum
   give Σ_h ReLU(D[h, key]) · w_h for every key;
2. the cp.async copy map (key 8·it + lane%8, piece 4·warp + lane/8) writes every 16-byte piece of
   a 64-key tile exactly once, at the operand layout's address;
3. the operand layout equals the PTX canonical K-major no-swizzle layout
   ((8,m),(T,2k)):((1T,SBO),(1,LBO)) with LBO = 128 B, SBO = 2048 B and k-step kk at + 256·kk.
Prints the epilogue's max error (fp64 noise) and "ok"; asserts on any mismatch.
"""
import numpy as np

rng=np.random.default_rng(1)
D=rng.standard_normal((64,64))  # [head, key] accumulator
w=rng.standard_normal(64)
# per thread registers per PTX accumulator layout
def dreg(warp,lane,i):
    g,t=lane>>2,lane&3
    j,rem=i//4,i%4
    row=16*warp+g+8*(rem//2); col=8*j+2*t+(rem%2)
    return D[row,col]
part=np.zeros((4,64))
for warp in range(4):
    v=np.zeros((32,16))
    for lane in range(32):
        g=lane>>2
        w0=w[16*warp+g]; w1=w[16*warp+g+8]
        for j in range(8):
            for e in range(2):
                v[lane,2*j+e]=max(dreg(warp,lane,4*j+e),0)*w0+max(dreg(warp,lane,4*j+2+e),0)*w1
    for (xor,half) in ((16,8),(8,4),(4,2)):
        nv=v.copy()
        for lane in range(32):
            hi=(lane&xor)!=0; p=lane^xor
            for k in range(half):
                keep = v[lane,k+half] if hi else v[lane,k]
                # partner sends: partner's hi is !hi -> partner sends (p_hi? v[p,k] : v[p,k+half])
                phi=(p&xor)!=0
                send = v[p,k] if phi else v[p,k+half]
                nv[lane,k]=keep+send
        v=nv
    for lane in range(32):
        g,t=lane>>2,lane&3
        part[warp,8*g+2*t]=v[lane,0]; part[warp,8*g+2*t+1]=v[lane,1]
got=((part[0]+part[1])+part[2])+part[3]
want=(np.maximum(D,0)*w[:,None]).sum(0)
err = np.abs(got - want).max()
print("epilogue max error", err)
assert err < 1e-9
# copy mapping coverage
cov={}
for warp in range(4):
    for lane in range(32):
        for it in range(8):
            key=8*it+(lane&7); kc=4*warp+(lane>>3)
            dst=it*2048+kc*128+(lane&7)*16
            assert dst==(key>>3)*2048+kc*128+(key&7)*16
            cov[(key,kc)]=cov.get((key,kc),0)+1
print(len(cov), set(cov.values()))
# canonical read address vs layout
for kk in range(8):
    for n in range(64):
        for kl in range(16):
            n0,n1=n%8,n//8; k0,k1=kl%8,kl//8
            a=256*kk + n0*16 + n1*2048 + k0*2 + k1*128
            d=16*kk+kl
            assert a==(n>>3)*2048+(d>>3)*128+(n&7)*16+(d&7)*2
print("ok")
