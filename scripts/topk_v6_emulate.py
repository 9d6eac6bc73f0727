#!/usr/bin/env python3
# Host emulation of the new index math of topk_kernel_v6 (src/ops/cuda/topk.cu): the per-CTA
# compaction of the keys >= F into the index-ordered list (packed per-group lane counts, warp scan,
# warp offsets) and the output from the list (chunked block scan of packed greater/tied counts),
# against a brute-force top-k; the threshold comes from the reference (full key, or the top-12-bit
# bin when it is taken whole). Slow (pure Python, ~minutes): python3 scripts/topk_v6_emulate.py
# Emulates topk_kernel_v6's new parts (compaction into the list; output from the list) per CTA,
# with the threshold (mask, prefix, krem, gt_lo, eq_lo) taken as the full key (exact) from a
# brute-force reference, and the final-bin variant (mask = top 12 bits) when the bin is taken whole.
import random, struct, math, sys
import numpy as np
THREADS=512
def okey(x):
    if x!=x: return 0
    if x==0.0: u=0
    else: u=struct.unpack('<I',struct.pack('<f',x))[0]
    return (~u)&0xffffffff if u&0x80000000 else u|0x80000000
def ref(s,k):
    n=len(s)
    idx=sorted(range(n),key=lambda i:(-okey(s[i]),i))[:min(n,k)]
    return sorted(idx)+[-1]*(k-min(n,k))
def run(s,k,C,ITEMS):
    n=len(s)
    keys_row=[okey(x) for x in s]
    P=(n+C*THREADS-1)//(C*THREADS); P=(P+3)&~3
    assert P<=ITEMS
    # reference threshold K* (full key) and counts
    order=sorted(range(n),key=lambda i:(-keys_row[i],i))
    Kst=keys_row[order[k-1]]
    out=[None]*k
    # Each CTA: list
    lists=[]
    for rank in range(C):
        cbase=rank*THREADS*P
        # per thread keys, tmax
        thr=[]
        for warp in range(16):
            for lane in range(32):
                wbase=cbase+warp*32*P
                ks=[];
                for i in range(ITEMS):
                    j=i//4; c=i%4
                    g=wbase+(j*32+lane)*4+c
                    valid = (4*j<P) and g<n
                    ks.append((keys_row[g] if valid else 0, valid, g))
                cnt=sum(1 for t in ks if t[1])
                # prefix property
                assert all(ks[i][1] for i in range(cnt)) and not any(ks[i][1] for i in range(cnt,ITEMS))
                thr.append((warp,lane,ks,cnt,max(t[0] for t in ks)))
        F=min(t[4] for t in thr)
        if k>THREADS: F=0
        # compaction emulation
        wcnt=[0]*16; per={}
        for warp in range(16):
            cl=[0]*32; ch=[0]*32
            for lane in range(32):
                _,_,ks,cnt,_=thr[warp*32+lane]
                for i in range(ITEMS):
                    b=1 if (i<cnt and ks[i][0]>=F) else 0
                    if i//4<4: cl[lane]+=b<<(8*(i//4))
                    else: ch[lane]+=b<<(8*(i//4-4))
            il=list(np.cumsum(cl)); ih=list(np.cumsum(ch))
            for x in il+ih: assert int(x) < 2**32
            tl=int(il[31]); th=int(ih[31])
            wcnt[warp]=sum(((tl>>(8*b))&255)+((th>>(8*b))&255) for b in range(4))
            per[warp]=(cl,ch,il,ih,tl,th)
        L=sum(wcnt)
        lk=[None]*L; li=[None]*L
        for warp in range(16):
            woff=sum(wcnt[:warp]); cl,ch,il,ih,tl,th=per[warp]
            for lane in range(32):
                _,_,ks,cnt,_=thr[warp*32+lane]
                gbase=woff
                for j in range(ITEMS//4):
                    sh=8*(j%4)
                    inc=int(il[lane] if j<4 else ih[lane]); own=cl[lane] if j<4 else ch[lane]; tot=tl if j<4 else th
                    pos=gbase+((inc>>sh)&255)-((own>>sh)&255)
                    lbase=warp*32*P+(j*32+lane)*4
                    for c in range(4):
                        i=4*j+c
                        if i<cnt and ks[i][0]>=F:
                            assert lk[pos] is None
                            lk[pos]=ks[i][0]; li[pos]=lbase+c
                            assert lbase+c < 65536 and cbase+lbase+c==ks[i][2]
                            pos+=1
                    gbase+=(tot>>sh)&255
        # list = keys >= F of the slice in index order
        exp=[(keys_row[g],g-cbase) for g in range(cbase,min(n,cbase+THREADS*P)) if keys_row[g]>=F]
        assert list(zip(lk,li))==exp, ("list mismatch", rank)
        assert all(x>=F for x in lk) and (Kst>=F)
        lists.append((cbase,lk,li,L))
    # threshold: full key, mask all ones
    for (mask) in (0xffffffff, 0xfff00000):
        prefix=Kst&mask
        G=sum(1 for x in keys_row if (x&mask)>prefix)
        krem=k-G
        E=sum(1 for x in keys_row if (x&mask)==prefix)
        if mask!=0xffffffff and E!=krem: continue  # only when the bin is taken whole
        out=[-2]*k
        gt_lo=0; eq_lo=0
        for rank in range(C):
            cbase,lk,li,L=lists[rank]
            s_=(L+THREADS-1)//THREADS
            vs=[]
            for tid in range(THREADS):
                beg=min(tid*s_,L); end=min(beg+s_,L); v=0
                for j in range(beg,end):
                    kk=lk[j]&mask
                    v+= 0x10000 if kk>prefix else (1 if kk==prefix else 0)
                vs.append(v)
            ex=0
            for tid in range(THREADS):
                beg=min(tid*s_,L); end=min(beg+s_,L)
                g=gt_lo+(ex>>16); e=eq_lo+(ex&0xffff)
                for j in range(beg,end):
                    kk=lk[j]&mask
                    if kk>prefix:
                        o=g+min(e,krem)
                        if o<k: out[o]=cbase+li[j]
                        g+=1
                    elif kk==prefix:
                        if e<krem and g+e<k: out[g+e]=cbase+li[j]
                        e+=1
                ex+=vs[tid]
            gt_lo+= ex>>16; eq_lo+= ex&0xffff
        r=ref(s,k)
        assert out==r, ("out mismatch", mask, [ (i,a,b) for i,(a,b) in enumerate(zip(out,r)) if a!=b][:5])
    return True
random.seed(1); np.random.seed(1)
cases=[]
for (C,ITEMS,n) in [(16,32,262144),(16,32,262144-777),(16,16,100000),(8,16,65536-5),(16,8,9000),(8,32,131072)]:
    for dist in ['normal','ties','special','alleq','rampup']:
        if dist=='normal': s=list(np.random.randn(n).astype(np.float32))
        elif dist=='ties': s=[0.0 if x<0.3 else round(x*4)/4 for x in np.random.randn(n)]
        elif dist=='special':
            s=list(np.random.randn(n).astype(np.float32))
            for i in range(n):
                u=random.randint(0,99)
                if u<5: s[i]=float('nan')
                elif u<10: s[i]=-math.inf
                elif u<12: s[i]=math.inf
                elif u<20: s[i]= 0.0 if u%2 else -0.0
        elif dist=='alleq': s=[1.5]*n
        else: s=[float(i) for i in range(n)]
        for k in ([512,100] if n>100000 else [512,1024,1]):
            if n<=k: continue
            run([float(x) for x in s],k,C,ITEMS); print("ok",C,ITEMS,n,dist,k,flush=True)
