#!/usr/bin/env python3
# v7 version (topk_kernel_v7, variants 38-41): THREADS 256 or 512, the pre-filter bound from each
# thread's (512/THREADS)-th largest key, byte-packed group counts in ITEMS/16 words, and the
# one-warp window walk of pass 0 (lane g = 4-bin group g, steps of 4/8/16/32 groups) checked
# against the direct bin / count computation. Derived from topk_v6_emulate.py:
# python3 scripts/topk_v7_emulate.py
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
def walk_check(lists,k,C):
    # pass-0 histograms of the list entries (top 12 bits), per CTA
    H=[[0]*4096 for _ in range(C)]
    tops=[]
    for rank in range(C):
        cbase,lk,li,L=lists[rank]
        for x in lk: H[rank][x>>20]+=1
        tops.append(((max(lk) if lk else 0)>>20)+1)
    krem=k
    tot=[sum(H[q][b] for q in range(C)) for b in range(4096)]
    # direct: bin where the count from the top first reaches krem
    acc=0
    for b in range(4095,-1,-1):
        if acc+tot[b]>=krem: bd=b; Gd=acc; Ed=tot[b]; break
        acc+=tot[b]
    for rank in range(C):
        gtop=max(tops)
        hi=(gtop+3)>>2; carry=0; carry_lo=0; zg=4; res=None
        while hi>0:
            ng=min(zg,hi)
            t4s=[];l4s=[]
            for lane in range(32):
                if lane<ng:
                    g0=4*(hi-1-lane)
                    v=[sum(H[q][g0+j] for q in range(C)) for j in range(4)]
                    vl=[sum(H[q][g0+j] for q in range(rank)) for j in range(4)]
                else: v=[0]*4; vl=[0]*4
                t4s.append([v[3],v[2],v[1],v[0]]); l4s.append([vl[3],vl[2],vl[1],vl[0]])
            st=[sum(t) for t in t4s]; sl=[sum(t) for t in l4s]
            it=list(np.cumsum(st)); il=list(np.cumsum(sl))
            cross=[lane<ng and carry+it[lane]-st[lane]<krem and carry+it[lane]>=krem for lane in range(32)]
            if any(cross):
                src=cross.index(True)
                acc=carry+it[src]-st[src]; accl=carry_lo+il[src]-sl[src]
                for j in range(4):
                    if acc+t4s[src][j]>=krem: jd=j; e=t4s[src][j]; ee=l4s[src][j]; break
                    acc+=t4s[src][j]; accl+=l4s[src][j]
                d=4*src+jd; res=(4*hi-1-d,acc,accl,e,ee); break
            carry+=int(it[31]); carry_lo+=int(il[31]); hi-=ng; zg=min(2*zg,32)
        assert res is not None
        b,G,Gl,E,El=res
        assert (b,G,E)==(bd,Gd,Ed), ("walk", rank, res, (bd,Gd,Ed))
        assert Gl==sum(H[q][bb] for q in range(rank) for bb in range(b+1,4096)) and El==sum(H[q][b] for q in range(rank))
def run(s,k,C,ITEMS,T):
    global THREADS
    THREADS=T
    NWp=T//32; RK=512//T
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
        for warp in range(NWp):
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
                thr.append((warp,lane,ks,cnt,sorted((t[0] for t in ks),reverse=True)[RK-1]))
        F=min(t[4] for t in thr)
        if k>RK*THREADS: F=0
        # compaction emulation
        wcnt=[0]*NWp; per={}
        for warp in range(NWp):
            NCW=(ITEMS//4+3)//4
            cw=[[0]*NCW for _ in range(32)]
            for lane in range(32):
                _,_,ks,cnt,_=thr[warp*32+lane]
                for i in range(ITEMS):
                    b=1 if (i<cnt and ks[i][0]>=F) else 0
                    cw[lane][i//16]+=b<<(8*((i//4)%4))
            iw=[[sum(cw[l][w] for l in range(lane+1)) for w in range(NCW)] for lane in range(32)]
            for row_ in iw:
                for x in row_: assert x < 2**32
            tw=iw[31]
            wcnt[warp]=sum((tw[w]>>(8*b))&255 for w in range(NCW) for b in range(4))
            per[warp]=(cw,iw,tw)
        L=sum(wcnt)
        lk=[None]*L; li=[None]*L
        for warp in range(NWp):
            woff=sum(wcnt[:warp]); cw,iw,tw=per[warp]
            for lane in range(32):
                _,_,ks,cnt,_=thr[warp*32+lane]
                gbase=woff
                for j in range(ITEMS//4):
                    sh=8*(j%4)
                    inc=iw[lane][j//4]; own=cw[lane][j//4]; tot=tw[j//4]
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
    walk_check(lists,k,C)
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
for (C,ITEMS,T,n) in [(16,64,256,262144),(16,64,256,262144-777),(16,16,256,60001),(16,32,512,262144),(16,32,256,100003)]:
    for dist in ['normal','ties','special','alleq','rampup','outlier','perthread']:
        if dist=='perthread':  # tests/cuda kPerThread: 256 huge keys one per thread of CTA 0 (256-thread layout), 256 medium ones
            P=((n+4095)//4096+3)&~3
            s=list((np.random.randn(n)*0.1).astype(np.float32))
            for idx in range(256*P):
                rem=idx%(32*P); j=rem//128; c=rem%4
                if c==0 and j==0: s[idx]=100+0.001*idx
                elif c==0 and j==1: s[idx]=10+0.001*idx
        elif dist in ('normal','outlier'):
            s=list(np.random.randn(n).astype(np.float32))
            if dist=='outlier':
                for _ in range(3): s[random.randrange(n)]=1e30
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
        for k in ([512,513,100] if dist in ('normal','rampup','perthread') else [512]):
            run([float(x) for x in s],k,C,ITEMS,T); print("ok",C,ITEMS,T,n,dist,k,flush=True)
