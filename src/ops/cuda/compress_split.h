// FlashCompressor work split (docs/cuda.md "FlashCompressor"): how compress_fused_rows_kernel
// (compressor.cu) divides one closing window over CTAs and threads, and the per-thread pooling
// math (online softmax over a contiguous slot range, then the merge of the slot partitions).
// Plain C++ with __host__ __device__ functions when compiled by nvcc, so the CPU tests
// (tests/model/test_compress_split.cpp) run the same plan and the same arithmetic on the host
// against the CPU op composition (internal header; no CUDA headers).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define V4_CS_HD __host__ __device__ __forceinline__
#else
#define V4_CS_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define V4_CS_UNROLL _Pragma("unroll")
#define V4_CS_UNROLL4 _Pragma("unroll 4")
#else
#define V4_CS_UNROLL
#define V4_CS_UNROLL4
#endif

namespace v4::cuda {

/// Launch plan of the FlashCompressor rows kernel for one (m, c, d, vector path) shape. It
/// depends on the shape only — never on the number of rows — so a row's result (summation order)
/// is the same in prefill and decode steps of any batch (fp32 batch invariance).
///
/// Output row r is served by `ctas` CTAs (a thread-block cluster when > 1); CTA k owns the channel
/// groups [k·gpc, min((k+1)·gpc, G)) (G = d / vec groups of `vec` adjacent channels). Inside a
/// CTA, thread t is (column x = t % gw, partition p = t / gw) for t < gw·parts: it walks the
/// groups x, x + gw, … of its CTA's range and, for each, the slots [p·spp, min((p+1)·spp, c·m)).
struct CompressRowsPlan {
  int vec = 1;       // channels per group: 4 (16-byte loads/stores) or 1
  int groups = 0;    // G = d / vec
  int spp = 1;       // slots per partition (contiguous)
  int parts = 1;     // P = ceil(c·m / spp) window partitions merged in shared memory
  int ctas = 1;      // K ≤ 8 CTAs per output row (cluster size), split over channels
  int gpc = 0;       // channel groups per CTA = ceil(G / K)
  int gw = 0;        // thread columns per CTA (≤ gpc)
  int threads = 0;   // blockDim: gw·P rounded up to a multiple of 32 (≤ kCompressMaxThreads)
  bool stage = true; // norm / inv_freq of the slice staged in shared memory with the slot
                     // indices (false only when that would not fit: very large d)
  int unroll = 4;    // slots per load batch of cs_fold_slots: 8 (a thread's whole partition in
                     // one batch of loads, ~116 registers) when spp > 4 on the vector path with
                     // one CTA per row; 4 (64 registers) otherwise — cluster plans launch K CTAs
                     // per row, also for the non-closing rows of a decode batch, and need the
                     // occupancy to stay in one wave
  bool prefetch = false;  // every load of a thread's partition (≤ 2 batches of `unroll` slots)
                          // issued before any math (cs_fold_slots_pf: the same arithmetic as
                          // cs_fold_slots, one L2 round trip instead of two); wide plans only
  size_t smem = 0;   // dynamic shared memory bytes (layout: compress_rows_smem)
  bool late_trigger = false;  // rows kernel: PDL trigger after the pooling loads, not right after
                              // the wait (compressor.cu; launch shape only, same results)
  bool exit_trigger = false;  // rows kernel: no explicit PDL trigger (the next kernel is scheduled
                              // as this grid's CTAs exit); overrides late_trigger
  bool more_regs = false;     // rows kernel: the instance with ≤ 85 registers per thread (3 CTAs of
                              // 256 threads per SM) instead of 64; launch shape only, same results
};

/// Channels per Σx² chunk. The RMSNorm's Σx² of a row is formed in an order that depends on d
/// only (cs_row_sumsq): chunk sums of 32 consecutive channels, each a 32-lane xor butterfly;
/// lane l < 32 adds chunks l, l + 32, … in order; a 32-lane xor butterfly adds the lanes. A CTA slice
/// always starts on a chunk boundary (plan: gpc·vec % 32 == 0 when K > 1), so the sum — and the
/// row — is the same for every K (base and wide plans are bit-identical by construction).
constexpr int kCsChunk = 32;

/// Largest number of Σx² chunks per row (d ≤ 32·384 = 12288): the kernel's static chunk array
/// (1.5 KB of static shared memory next to the ≤ kCompressSmemLimit dynamic bytes).
constexpr int kCsMaxChunks = 384;

/// Largest CTA of the rows kernel (its __launch_bounds__).
constexpr int kCompressMaxThreads = 256;

/// Byte offsets inside the dynamic shared memory of one CTA.
struct CompressRowsSmem {
  size_t src = 0;    // int32 [c·m]        the row's slot indices
  size_t part = 0;   // float [3][P][cw]   partition max / Σexp / Σexp·kv (only when P > 1)
  size_t row = 0;    // float [cw]         pooled channels of the CTA's slice
  size_t norm = 0;   // float [cw]         RMSNorm weights of the slice (staged with src)
  size_t freq = 0;   // float [cw/2]       inv_freq of the slice's channel pairs (staged with src)
  size_t total = 0;
};

/// `stage`: the norm / freq regions exist (CompressRowsPlan::stage); else they are empty.
V4_CS_HD CompressRowsSmem compress_rows_smem(int n_slots, int parts, int cw, bool stage) {
  CompressRowsSmem s;
  s.src = 0;
  s.part = (size_t(n_slots) * 4 + 15) / 16 * 16;
  s.row = s.part + (parts > 1 ? size_t(3) * size_t(parts) * size_t(cw) * 4 : 0);
  s.norm = s.row + size_t(cw) * 4;
  s.freq = s.norm + (stage ? size_t(cw) * 4 : 0);
  s.total = s.freq + (stage ? size_t(cw + 1) / 2 * 4 : 0);
  return s;
}

/// Dynamic shared memory limit the plan stays under: with the kernel's static arrays (Σx² chunks,
/// dst: ~1.5 KB) within the 48 KB a CTA gets without the opt-in attribute.
constexpr size_t kCompressSmemLimit = 46 * 1024;

/// Sets gpc (rounded up to whole Σx² chunks when the row is split: kCsChunk / vec groups), the
/// resulting ctas ≤ the requested one, gw and threads from pl.ctas, pl.groups, pl.parts, pl.vec.
inline void compress_plan_slices(CompressRowsPlan& pl) {
  pl.gpc = (pl.groups + pl.ctas - 1) / pl.ctas;
  if (pl.ctas > 1) {
    const int q = kCsChunk / pl.vec;  // vec path only (the scalar path has K = 1)
    pl.gpc = (pl.gpc + q - 1) / q * q;
    pl.ctas = (pl.groups + pl.gpc - 1) / pl.gpc;
  }
  pl.gw = std::min(pl.gpc, std::max(1, kCompressMaxThreads / pl.parts));
  pl.threads = (pl.gw * pl.parts + 31) / 32 * 32;
}

/// The plan for ratio m, overlap c, dim d; `vec_ok` = d % 4 == 0 and every row pointer is 16-byte
/// aligned. Rules: ≤ 8 slots per thread (one batch of loads in flight), ≤ 32 partitions; rows with
/// fewer than 64 (group, partition) pairs halve spp down to 4; K = ceil(G·P / 256) CTAs per row
/// (≤ 8; 1 on the scalar path, whose RoPE pairs may straddle a CTA boundary); ≤ 256 threads per
/// CTA (a thread then walks several groups of its slice). Returns threads = 0
/// when even P = 1 does not fit the shared memory limit (d > ~12K).
inline CompressRowsPlan plan_compress_rows(int m, int c, int d, bool vec_ok) {
  CompressRowsPlan pl;
  const int ns = c * m;
  pl.vec = vec_ok && d % 4 == 0 ? 4 : 1;
  pl.groups = d / pl.vec;
  if (d > kCsChunk * kCsMaxChunks) return pl;  // threads = 0: too large
  pl.spp = std::min(ns, 8);
  pl.parts = (ns + pl.spp - 1) / pl.spp;
  if (pl.parts > 32) {
    pl.parts = 32;
    pl.spp = (ns + 31) / 32;
    pl.parts = (ns + pl.spp - 1) / pl.spp;
  }
  while (int64_t(pl.groups) * pl.parts < 64 && pl.spp > 4) {
    pl.spp = (pl.spp + 1) / 2;
    pl.parts = (ns + pl.spp - 1) / pl.spp;
  }
  for (;;) {
    const int64_t per_row = int64_t(pl.groups) * pl.parts;
    pl.ctas = pl.vec == 4 ? int(std::min<int64_t>(8, std::max<int64_t>(1, (per_row + 255) / 256))) : 1;
    pl.ctas = std::min(pl.ctas, pl.groups);
    compress_plan_slices(pl);
    // 4-slot load batches everywhere: on the H200 (bench/results/cuda-compressor.md, 6e80892) 8
    // slots made prefill 8K C4 d512 39.7 µs vs 28.8 with 4 (99% of a same-size memcpy), while
    // decode gained only 0.4 µs. The batch size changes the online-softmax rounding, so it must
    // not depend on the row count (batch invariance): one value for all. V4_COMPRESS_UNROLL=8
    // still selects 8 for A/B runs.
    pl.unroll = 4;
    pl.stage = true;
    pl.smem = compress_rows_smem(ns, pl.parts, pl.gpc * pl.vec, true).total;
    if (pl.smem <= kCompressSmemLimit) return pl;
    if (pl.parts == 1) {
      pl.stage = false;  // last resort: norm / inv_freq read from global memory at the store
      pl.smem = compress_rows_smem(ns, pl.parts, pl.gpc * pl.vec, false).total;
      if (pl.smem > kCompressSmemLimit) pl.threads = 0;
      return pl;
    }
    pl.spp *= 2;  // fewer partitions: less merge storage
    pl.parts = (ns + pl.spp - 1) / pl.spp;
  }
}

/// The WIDE plan (decode-sized calls, compressor.cu): the same numerics as plan_compress_rows
/// (vec, spp, parts, unroll: the per-channel pooling order) spread over more, smaller CTAs —
/// K = ceil(G·P / 32) ≤ 8 CTAs per row, so about one warp of (group, partition) pairs per CTA and a
/// closing row's loads come from K SMs — with every load of a thread's slots in flight at once
/// (prefetch). Same rows bit for bit (kCsChunk: Σx² order independent of K). Falls back to the
/// base plan (prefetch = false) on the scalar path, when spp > 2·unroll or when unroll ≠ 4.
inline CompressRowsPlan plan_compress_rows_wide(int m, int c, int d, bool vec_ok) {
  const CompressRowsPlan base = plan_compress_rows(m, c, d, vec_ok);
  if (base.threads == 0 || base.vec != 4 || base.unroll != 4 || base.spp > 2 * base.unroll)
    return base;
  CompressRowsPlan pl = base;
  const int64_t pairs = int64_t(pl.groups) * pl.parts;
  pl.ctas = int(std::min<int64_t>(8, std::max<int64_t>(base.ctas, (pairs + 31) / 32)));
  pl.ctas = std::min(pl.ctas, pl.groups);
  compress_plan_slices(pl);
  pl.prefetch = true;
  pl.smem = compress_rows_smem(c * m, pl.parts, pl.gpc * pl.vec, pl.stage).total;
  if (pl.smem > kCompressSmemLimit) return base;
  return pl;
}

/// Thread budget of the wide plan's grid (n_out·K·threads): about one wave of its kernel (~115
/// registers: 2 CTAs of 256 threads per SM on the H200's 132 SMs). compressor.cu takes the wide
/// plan for calls within it (compress_wide_fits) unless V4_COMPRESS_WIDE says otherwise.
constexpr int64_t kCompressWideMaxThreads = 65536;

/// True when a call of n_out output rows takes the wide plan `wide` by default: it is one
/// (prefetch) and its grid fits kCompressWideMaxThreads — decode steps of C4 and the indexer at
/// any batch ≤ 256 (C4 d512: 4 CTAs of 32 threads per row), C128 up to 32 rows; not the prefill
/// grids (C128 8K: 64 rows × 8 CTAs × 256 threads would take two waves).
inline bool compress_wide_fits(int64_t n_out, const CompressRowsPlan& wide) {
  return wide.prefetch && n_out * wide.ctas * wide.threads <= kCompressWideMaxThreads;
}

/// `vec` consecutive floats (a register array; 16-byte loads on the device when vec = 4).
template <int V>
struct CsVec {
  float v[V];
};

template <int V>
V4_CS_HD CsVec<V> cs_load(const float* p) {
  CsVec<V> r;
#if defined(__CUDA_ARCH__)
  if constexpr (V == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = t.x;
    r.v[1] = t.y;
    r.v[2] = t.z;
    r.v[3] = t.w;
  } else {
    r.v[0] = __ldg(p);
    static_assert(V == 1, "vec is 4 or 1");
  }
#else
  for (int i = 0; i < V; ++i) r.v[i] = p[i];
#endif
  return r;
}

/// Online softmax state of one channel over some slots: running max of gate + bias, Σexp(l − mx)
/// and Σexp(l − mx)·kv. Empty state: mx = −inf, sum = acc = 0.
struct CsAcc {
  float mx, sum, acc;
};

/// The pooling inputs (CompressArgs fields; state = the ring before this step's refresh).
struct CsInputs {
  const float* fresh_kv;
  const float* fresh_gate;
  const float* state_kv;
  const float* state_gate;
  const float* bias;
  int m, c, d;
};

/// Loads slot j of one row for channels ch..ch+V−1 (gate + bias into lg, kv into kv); an empty
/// slot (j ≥ j1 or index −1) gives lg = −inf, kv = 0 without loads.
template <int V>
V4_CS_HD void cs_load_slot(const CsInputs& in, const int32_t* slots, int j, int j1, int ch,
                           CsVec<V>& lg, CsVec<V>& kv) {
  const int32_t s = j < j1 ? slots[j] : -1;
  if (s == -1) {
V4_CS_UNROLL
    for (int i = 0; i < V; ++i) {
      lg.v[i] = -INFINITY;
      kv.v[i] = 0.f;
    }
    return;
  }
  const int64_t width = int64_t(in.c) * in.d;
  const bool b = in.c == 2 && j >= in.m;  // series b: own window, channels [d, 2d)
  const int64_t off = (b ? in.d : 0) + ch;
  const int brow = b ? j - in.m : j;
  const bool fresh = s >= 0;
  const int64_t row = fresh ? s : (-int64_t(s) - 2);
  const CsVec<V> g = cs_load<V>((fresh ? in.fresh_gate : in.state_gate) + row * width + off);
  const CsVec<V> bb = cs_load<V>(in.bias + int64_t(brow) * width + off);
  kv = cs_load<V>((fresh ? in.fresh_kv : in.state_kv) + row * width + off);
V4_CS_UNROLL
  for (int i = 0; i < V; ++i) lg.v[i] = g.v[i] + bb.v[i];
}

/// Folds one loaded batch of U slots into the channel states: per channel the running max is
/// updated once (rescaling sum/acc by exp(old − new)), then each slot adds exp(l − mx) and
/// exp(l − mx)·kv. The one piece of pooling arithmetic of every plan (cs_fold_slots and
/// cs_fold_slots_pf call it with the same batches, so their results are bit-identical).
template <int V, int U>
V4_CS_HD void cs_fold_batch(const CsVec<V>* lg, const CsVec<V>* kv, CsAcc (&st)[V]) {
V4_CS_UNROLL
  for (int i = 0; i < V; ++i) {
    float bm = lg[0].v[i];
V4_CS_UNROLL
    for (int u = 1; u < U; ++u) bm = fmaxf(bm, lg[u].v[i]);
    const float nm = fmaxf(st[i].mx, bm);
    if (nm == -INFINITY) continue;  // nothing non-empty yet
    const float sc = expf(st[i].mx - nm);  // 0 when the state was empty, 1 when mx is unchanged
    float sum = st[i].sum * sc, acc = st[i].acc * sc;
V4_CS_UNROLL
    for (int u = 0; u < U; ++u) {
      const float e = expf(lg[u].v[i] - nm);  // empty slot: exp(−inf) = 0, kv = 0
      sum += e;
      acc += e * kv[u].v[i];
    }
    st[i] = CsAcc{nm, sum, acc};
  }
}

/// Folds slots [j0, j1) of one row (slot indices `slots`, CompressArgs::src convention) into the
/// states of channels ch..ch+V−1 (ch % V == 0). Slots are taken in batches of U (the plan's
/// `unroll`): every load of a batch is issued before any use (cs_load_slot), then cs_fold_batch.
template <int V, int U = 4>
V4_CS_HD void cs_fold_slots(const CsInputs& in, const int32_t* slots, int j0, int j1, int ch,
                            CsAcc (&st)[V]) {
  for (int jb = j0; jb < j1; jb += U) {
    CsVec<V> lg[U], kv[U];
V4_CS_UNROLL
    for (int u = 0; u < U; ++u) cs_load_slot<V>(in, slots, jb + u, j1, ch, lg[u], kv[u]);
    cs_fold_batch<V, U>(lg, kv, st);
  }
}

/// cs_fold_slots for j1 − j0 ≤ NB·U with every load of all NB batches issued first (one round
/// trip to L2 / HBM instead of NB dependent ones; NB·U·3 vector loads in registers), then the
/// same batches folded in the same order: bit-identical to cs_fold_slots<V, U>.
template <int V, int U, int NB>
V4_CS_HD void cs_fold_slots_pf(const CsInputs& in, const int32_t* slots, int j0, int j1, int ch,
                               CsAcc (&st)[V]) {
  CsVec<V> lg[NB * U], kv[NB * U];
V4_CS_UNROLL
  for (int u = 0; u < NB * U; ++u) cs_load_slot<V>(in, slots, j0 + u, j1, ch, lg[u], kv[u]);
V4_CS_UNROLL
  for (int b = 0; b < NB; ++b)
    if (j0 + b * U < j1) cs_fold_batch<V, U>(lg + b * U, kv + b * U, st);
}

/// Adds 32 lane values with a xor butterfly (lane i adds lane i ^ o for o = 16, 8, 4, 2, 1): what
/// `__shfl_xor_sync` reductions compute (every lane ends with the same bits: fp addition is
/// commutative). Host reference of the rows kernel's warp sums.
inline float cs_butterfly32(float (&lane)[32]) {
  for (int o = 16; o; o >>= 1) {
    float nx[32];
    for (int l = 0; l < 32; ++l) nx[l] = lane[l] + lane[l ^ o];
    for (int l = 0; l < 32; ++l) lane[l] = nx[l];
  }
  return lane[0];
}

/// Σx² of a pooled row of d channels in the kCsChunk order — what the rows kernel computes across
/// its CTAs and warps, for any K: chunk q (channels [32q, 32q + 32) ∩ [0, d)) = butterfly of the
/// 32 lanes' x² (lane i: channel 32q + i, 0 past d; one warp per chunk, conflict-free shared
/// memory reads); lane l adds chunks l, l + 32, … in order; a butterfly adds the lanes.
inline float cs_row_sumsq(const float* row, int d) {
  const int nq = (d + kCsChunk - 1) / kCsChunk;
  std::vector<float> chunk(static_cast<size_t>(nq));
  for (int q = 0; q < nq; ++q) {
    float lane[32];
    for (int i = 0; i < 32; ++i) {
      const int ch = q * kCsChunk + i;
      lane[i] = ch < d ? row[ch] * row[ch] : 0.f;
    }
    chunk[size_t(q)] = cs_butterfly32(lane);
  }
  float lane[32];
  for (int l = 0; l < 32; ++l) {
    float v = 0.f;
    for (int q = l; q < nq; q += 32) v += chunk[size_t(q)];
    lane[l] = v;
  }
  return cs_butterfly32(lane);
}

/// Merges partition states (in partition order p = 0..n−1, element p at parts[p·stride]) with
/// the standard rescale and returns the pooled value Σacc_p·e_p / Σsum_p·e_p, e_p = exp(mx_p − M),
/// M = max mx_p; 0 when every slot was empty (as compress_pool). The loops are unrolled by 4 on
/// the device (loads and exps of 4 partitions in flight; the sums keep their order).
V4_CS_HD float cs_merge(const float* mx, const float* sum, const float* acc, int n,
                        int64_t stride) {
  float M = -INFINITY;
V4_CS_UNROLL4
  for (int p = 0; p < n; ++p) M = fmaxf(M, mx[p * stride]);
  if (M == -INFINITY) return 0.f;
  float S = 0.f, A = 0.f;
V4_CS_UNROLL4
  for (int p = 0; p < n; ++p) {
    const float q = mx[p * stride];
    if (q == -INFINITY) continue;
    const float e = expf(q - M);
    S += sum[p * stride] * e;
    A += acc[p * stride] * e;
  }
  return A / S;
}

}  // namespace v4::cuda
