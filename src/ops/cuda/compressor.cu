#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// FlashCompressor (compressor.h). The pooled, normalised and roped rows never leave the SM; the
// window is split over CTAs (channel slices, one cluster per row) and threads (slot partitions,
// online softmax) by the plan of compress_split.h. fp32 results match the unfused CUDA sequence
// compress_pool → rmsnorm → rope_interleaved → store_rows up to summation order (the softmax
// partition merge and the Σx² tree differ; same rotation expression).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/compress_split.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/device_util.cuh"

namespace v4::cuda {
namespace {

namespace cg = cooperative_groups;

// Programmatic dependent launch (PDL, sm_90): every kernel here is launched with programmatic
// stream serialization, so it may start while the previous kernel of the stream is still running;
// `pdl_wait` (griddepcontrol.wait) blocks until that kernel has completed and its memory is
// visible. Every CTA calls it after its first round of loads (plan indices and parameters only —
// CompressFusedArgs forbids the immediately preceding kernel to write those) and before reading
// the fresh rows / state or writing anything, and before any exit, so a kernel of this file never
// completes before its predecessor (the dependency stays transitive). `pdl_trigger`, right after
// the wait, lets the next PDL-launched kernel be scheduled once every CTA of this grid has passed
// its wait (so the next kernel's pre-wait loads never race with this one's predecessor); that
// kernel still waits for this grid's completion before touching the data (device_util.cuh).

// Stores VEC finished values o[0..VEC) at value index i of the pool (i % VEC == 0) in the pool's
// element type (a.pool_dtype: f32, or bf16 rounded to nearest even as the CPU backend does).
template <int VEC>
__device__ __forceinline__ void store_pool_values(const ops::CompressFusedArgs& a, int64_t i,
                                                  const float* o) {
  if (a.pool_dtype == KvDtype::kBf16) {
    uint16_t* p = static_cast<uint16_t*>(a.pool) + i;
    if constexpr (VEC == 4) {  // 8 bytes, 8-byte aligned (pool 16-aligned, i % 4 == 0)
      const uint2 u = make_uint2(
          uint32_t(kv_f32_to_bf16(o[0])) | (uint32_t(kv_f32_to_bf16(o[1])) << 16),
          uint32_t(kv_f32_to_bf16(o[2])) | (uint32_t(kv_f32_to_bf16(o[3])) << 16));
      *reinterpret_cast<uint2*>(p) = u;
    } else {
      p[0] = kv_f32_to_bf16(o[0]);
    }
    return;
  }
  float* p = static_cast<float*>(a.pool) + i;
  if constexpr (VEC == 4)
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
  else
    p[0] = o[0];
}

// fp8 rows: stores the rope values among o[0..VEC) (channels ch0 + i ≥ nope) of a row as bf16
// (kvfp8::bf16_encode, round to nearest even as the CPU) at L.rope_off; nope channels are left
// to the quantization pass. VEC = 4 with the whole group rope and (ch0 − nope) % 4 == 0: one
// 8-byte store (rope_off % 16 == 0, rows 16-byte aligned); otherwise 2-byte stores.
template <int VEC>
__device__ __forceinline__ void store_fp8_rope(uint8_t* row, const KvFp8Layout& L, int ch0,
                                               int nope, const float* o) {
  uint16_t* r = reinterpret_cast<uint16_t*>(row + L.rope_off);
  if constexpr (VEC == 4) {
    if (ch0 >= nope && (ch0 - nope) % 4 == 0) {
      *reinterpret_cast<uint2*>(r + (ch0 - nope)) = make_uint2(
          uint32_t(kvfp8::bf16_encode(o[0])) | (uint32_t(kvfp8::bf16_encode(o[1])) << 16),
          uint32_t(kvfp8::bf16_encode(o[2])) | (uint32_t(kvfp8::bf16_encode(o[3])) << 16));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i)
    if (ch0 + i >= nope) r[ch0 + i - nope] = kvfp8::bf16_encode(o[i]);
}

// The RoPE'd value of one channel of a pair (x0, x1) = (channel 2q, 2q + 1) of the rotated part:
// angle f·pos (one fp32 product, as the rope kernel), sin / cos scaled by `att`; the even channel
// gets x0·cos − x1·sin, the odd one x0·sin + x1·cos. The roundings are spelled out (one product
// rounded, then one fused multiply-add) so that every kernel of this file computes the same bits
// whatever the compiler would contract (the rows kernel and the row-warp kernel are compared
// bit for bit).
__device__ __forceinline__ float cs_rope_value(float x0, float x1, float f, float pos, float att,
                                               bool odd) {
  const float ang = f * pos;
  float sn, cs;
  sincosf(ang, &sn, &cs);
  sn *= att;
  cs *= att;
  return odd ? __fmaf_rn(x0, sn, __fmul_rn(x1, cs)) : __fmaf_rn(x0, cs, -__fmul_rn(x1, sn));
}

// Ring items per thread of a ring CTA (all loads in flight before the stores).
constexpr int kRingPerThread = 4;

// Ring refresh items [base, base + kRingPerThread·nt) of the flattened (entry k, array, column)
// space: item i → k = i / (2w), array = (i / w) % 2 (0 kv, 1 gate), column i % w, w = c·d / RV
// (RV = 4: float4 columns). Indices of every item first, then every load, then the stores.
template <int RV>
__device__ __forceinline__ void ring_copy_items(const ops::CompressFusedArgs& a, int64_t base,
                                                int tid, int nt) {
  using V = typename std::conditional<RV == 4, float4, float>::type;
  const int64_t w = int64_t(a.overlap) * a.dim / RV, total = a.n_ring * 2 * w;
  int64_t k[kRingPerThread], col[kRingPerThread];
  int arr[kRingPerThread];
  int32_t to[kRingPerThread], from[kRingPerThread];
#pragma unroll
  for (int u = 0; u < kRingPerThread; ++u) {
    const int64_t i = base + tid + int64_t(u) * nt;
    k[u] = i / (2 * w);
    const int64_t rem = i - k[u] * 2 * w;
    arr[u] = int(rem / w);
    col[u] = rem - arr[u] * w;
    to[u] = -1;
    from[u] = 0;
    if (i < total) {
      to[u] = __ldg(a.ring_dst + k[u]);
      from[u] = __ldg(a.ring_src + k[u]);
    }
  }
  // The index loads above may overlap the predecessor kernel (never written by it: ops.h); the
  // fresh rows are read and the ring written only after it completed.
  pdl_wait();
  pdl_trigger();
  V v[kRingPerThread];
#pragma unroll
  for (int u = 0; u < kRingPerThread; ++u)
    if (to[u] >= 0) {
      const V* src = reinterpret_cast<const V*>(arr[u] ? a.fresh_gate : a.fresh_kv);
      v[u] = __ldg(src + int64_t(from[u]) * w + col[u]);
    }
#pragma unroll
  for (int u = 0; u < kRingPerThread; ++u)
    if (to[u] >= 0) {
      V* dst = reinterpret_cast<V*>(arr[u] ? a.state_gate : a.state_kv);
      dst[int64_t(to[u]) * w + col[u]] = v[u];
    }
}

// One closing window per cluster of pl.ctas CTAs (compress_split.h: CompressRowsPlan); n_out ·
// pl.ctas CTAs after the ring CTAs (if any). Each CTA owns a channel slice of the row; its threads split the
// window's slots into pl.parts contiguous partitions and read the kv / gate / bias rows of their
// slots with `VEC`-wide loads (a batch of U slots, all its loads in flight before any use),
// folding them into an online softmax state per channel (cs_fold_slots). Then, per CTA:
// partitions merged in order in shared memory (cs_merge) → pooled slice; sum of squares of the
// slice (block reduction, fixed order); the K slice sums added in rank order through distributed
// shared memory (every CTA of the cluster forms the same total); RMSNorm · norm; RoPE pairs
// (2i, 2i+1) on the trailing rope_dim channels (a pair never straddles a slice: slices are
// multiples of 4 channels on the vector path and whole rows on the scalar one); one `VEC`-wide
// store into pool[dst[r]]. The row's slot indices, dst, position, norm slice and inv_freq slice
// are all fetched in one first round of loads, before the PDL wait.
//
// RING (one-launch form, CompressFusedArgs::ring_disjoint): the first `ring_ctas` CTAs refresh
// the ring instead (ring_copy_items with RV = VEC, kRingPerThread items per thread), the pooling
// CTAs follow (row r = (blockIdx − ring_ctas) / K). Correct only because no refreshed ring row is
// read as state by any window of the call (the caller's promise); they run concurrently with the
// pooling CTAs (first, so in the first wave of a multi-wave prefill grid, not its tail). Whole
// clusters of them: ring_ctas is a multiple of K, so a cluster is all-ring or all-pooling and
// ring clusters never reach the cluster barriers. ring_ctas = 0 without RING.
// Batches of 4: ≤ 64 registers (4 CTAs of 256 threads per SM: the C128 prefill-8K grid of 512
// CTAs and a decode B = 64 grid of 512 + ring CTAs stay one wave); batches of 8 need ~116.
// FP8 (fp8 pools, a.pool_dtype == kFp8; separate instances so the f32 / bf16 kernels are
// unchanged): the final store quantizes (step 4 below: block amax from the chunk grid over the
// cluster, kvfp8::quantize), the rope values are stored as bf16.
// PF (wide plans, CompressRowsPlan::prefetch): each thread's ≤ 2·U slots are all loaded before
// any math (cs_fold_slots_pf, bit-identical to cs_fold_slots): ~100 registers, 2 CTAs of 256
// threads per SM at most (the wide C4 plans have 32-thread CTAs).
// IDX (fp8 indexer-key pools, a.pool_dtype == kFp8Index, kv_fp8_index_layout(d) rows: d codes +
// one f32 scale; separate instances, vector path only, FP8 false): every finished value (rope
// included) goes back into s_row in place (safe: with VEC = 4, c0 % 4 == 0 and nope even, a RoPE
// pair lies inside one thread's group, computed before it is written), then step 5 below: the
// row amax from the chunk grid over the cluster, one scale, kvfp8::quantize of every channel —
// the bytes of kvfp8::quantize_index_row of the same f32 row.
// HR (half-CTA rows: CompressRowsPlan::more_regs): the same kernel compiled for 3 CTAs of 256
// threads per SM instead of 4 (≤ 85 registers instead of 64: no spills, every load of a 4-slot
// batch in flight) for the 128-thread CTAs of rows_close calls, whose grids hold ~4 CTAs per SM.
template <int VEC, int U, bool RING, bool PF, bool FP8, bool IDX = false, bool HR = false>
__global__ void __launch_bounds__(kCompressMaxThreads, U == 8 ? 1 : PF ? 2 : HR ? 3 : 4)
    compress_fused_rows_kernel(ops::CompressFusedArgs a, CompressRowsPlan pl, int64_t ring_ctas,
                               bool floor) {
  extern __shared__ float4 smem_f4[];
  __shared__ float s_chunk[kCsMaxChunks];  // Σx² of the slice's kCsChunk-channel chunks
  __shared__ int32_t s_dst;
  const int K = pl.ctas;
  const int tid = threadIdx.x, nt = blockDim.x;
  if (RING && int64_t(blockIdx.x) < ring_ctas) {
    if (floor) {  // diagnostic (floor_only): no copy
      pdl_wait();
      pdl_trigger();
      return;
    }
    // Each ring CTA copies `rounds` consecutive chunks of kRingPerThread·nt items (rounds > 1
    // when the host launched fewer ring CTAs: V4_COMPRESS_RING_ROUNDS).
    const int64_t items = a.n_ring * 2 * (int64_t(a.overlap) * a.dim / VEC);
    const int64_t per = int64_t(kRingPerThread) * nt;
    const int64_t rounds = (items + ring_ctas * per - 1) / (ring_ctas * per);
    for (int64_t k = 0; k < rounds; ++k)
      ring_copy_items<VEC>(a, (int64_t(blockIdx.x) * rounds + k) * per, tid, nt);
    return;
  }
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_f4);
  const int64_t cta = int64_t(blockIdx.x) - (RING ? ring_ctas : 0);
  const int64_t r = cta / K;
  const int rank = int(cta % K);
  const int d = a.dim, ns = a.overlap * a.ratio;
  const int g0 = rank * pl.gpc, g1 = min(pl.groups, g0 + pl.gpc);
  const int c0 = g0 * VEC, cw = max(0, g1 - g0) * VEC, cw_max = pl.gpc * VEC;
  const int rd = a.rope_dim, nope = d - rd;
  const CompressRowsSmem lay = compress_rows_smem(ns, pl.parts, cw_max, pl.stage);
  int32_t* s_src = reinterpret_cast<int32_t*>(smem + lay.src);
  float* s_part = reinterpret_cast<float*>(smem + lay.part);  // [3][P][cw_max]
  float* s_row = reinterpret_cast<float*>(smem + lay.row);    // [cw_max]
  float* s_norm = reinterpret_cast<float*>(smem + lay.norm);  // [cw_max]
  float* s_freq = reinterpret_cast<float*>(smem + lay.freq);  // [cw_max / 2]
  // Round 1: every index / parameter load of the CTA (independent of each other).
  const float pos = rd > 0 ? float(__ldg(a.positions + r)) : 0.f;
  if (tid == 0) s_dst = __ldg(a.dst + r);
  for (int j = tid; j < ns; j += nt) s_src[j] = __ldg(a.src + r * ns + j);
  if (pl.stage)
    for (int l = tid; l < cw; l += nt) s_norm[l] = a.norm ? __ldg(a.norm + c0 + l) : 1.f;
  // RoPE pairs q (channels nope + 2q, nope + 2q + 1) of the slice: q ∈ [q_lo, q_hi), staged at
  // s_freq[q − q_lo]. Vector path: c0 and nope are even and a pair never straddles a slice;
  // scalar path: one slice (c0 = 0, q_lo = 0), nope may be odd.
  const int q_lo = max(0, c0 - nope) / 2, q_hi = min(rd / 2, max(0, c0 + cw - nope) / 2);
  if (pl.stage)
    for (int q = q_lo + tid; q < q_hi; q += nt) s_freq[q - q_lo] = __ldg(a.inv_freq + q);
  // Round 1 overlaps the predecessor kernel's tail: the arrays above are never written by the
  // kernel issued right before compress_fused (ops.h CompressFusedArgs); everything below
  // (fresh rows, state ring, pool) may be.
  pdl_wait();
  if (!pl.late_trigger && !pl.exit_trigger) pdl_trigger();
  __syncthreads();
  // Window not closing (device-planned decode rows): the whole cluster exits. `floor`: the
  // benchmark's latency-floor diagnostic (floor_only), every CTA exits here.
  if (s_dst < 0 || floor) return;

  // 1. Pooling of the slice.
  const CsInputs in{a.fresh_kv, a.fresh_gate, a.state_kv, a.state_gate, a.bias, a.ratio, a.overlap, d};
  const int x = tid % pl.gw, p = tid / pl.gw;
  if (p < pl.parts) {
    const int j0 = p * pl.spp, j1 = min(ns, j0 + pl.spp);
    for (int g = g0 + x; g < g1; g += pl.gw) {
      CsAcc st[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) st[i] = CsAcc{-INFINITY, 0.f, 0.f};
      if constexpr (PF)
        cs_fold_slots_pf<VEC, U, 2>(in, s_src, j0, j1, g * VEC, st);  // host: spp ≤ 2·U
      else
        cs_fold_slots<VEC, U>(in, s_src, j0, j1, g * VEC, st);
      const int l = (g - g0) * VEC;  // channel within the slice
      if (pl.parts == 1) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s_row[l + i] = cs_merge(&st[i].mx, &st[i].sum, &st[i].acc, 1, 0);
      } else {
        const int64_t plane = int64_t(pl.parts) * cw_max;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const int64_t o = int64_t(p) * cw_max + l + i;
          s_part[o] = st[i].mx;
          s_part[plane + o] = st[i].sum;
          s_part[2 * plane + o] = st[i].acc;
        }
      }
    }
  }
  // Late trigger (CompressRowsPlan::late_trigger): the next kernel of the stream is scheduled
  // once every CTA has its window loaded, so its CTAs do not take SM slots from this grid's.
  if (pl.late_trigger && !pl.exit_trigger) pdl_trigger();
  __syncthreads();
  if (pl.parts > 1) {
    const int64_t plane = int64_t(pl.parts) * cw_max;
    for (int l = tid; l < cw; l += nt)
      s_row[l] = cs_merge(s_part + l, s_part + plane + l, s_part + 2 * plane + l, pl.parts, cw_max);
    __syncthreads();
  }

  // 2. RMSNorm: Σ x² in the kCsChunk order (compress_split.h cs_row_sumsq), independent of K:
  // one warp per 32-channel chunk of the slice (a slice starts on a chunk boundary): lane i
  // squares channel 32q + i, a butterfly adds them (conflict-free reads), lane 0 stores the chunk
  // sum; then in every warp lane l adds chunks l, l + 32, … of the whole row (read from the
  // owning CTA's s_chunk through distributed shared memory when K > 1) and a butterfly adds the
  // lanes — every lane of every CTA of the cluster forms the same total.
  const int lane = tid & 31, warp = tid >> 5, n_warps = nt >> 5;
  const int nq = (cw + kCsChunk - 1) / kCsChunk;       // chunks of this slice
  const int cpr = (cw_max + kCsChunk - 1) / kCsChunk;  // chunks per full slice (exact when K > 1)
  const int nq_row = (d + kCsChunk - 1) / kCsChunk;
  for (int q = warp; q < nq; q += n_warps) {  // warp-uniform
    const int l = q * kCsChunk + lane;
    float v = l < cw ? __fmul_rn(s_row[l], s_row[l]) : 0.f;  // rounded square: no FMA into the sum
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) s_chunk[q] = v;
  }
  float total = 0.f;
  if (K > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every chunk sum written and visible cluster-wide
    for (int q = lane; q < nq_row; q += 32)
      total += *cluster.map_shared_rank(&s_chunk[q % cpr], unsigned(q / cpr));
    for (int o = 16; o; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    cluster.sync();  // remote reads done before any CTA of the cluster may exit
  } else {
    __syncthreads();
    for (int q = lane; q < nq_row; q += 32) total += s_chunk[q];
    for (int o = 16; o; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  }
  const float inv = rsqrtf(total / float(int64_t(d)) + a.eps);

  // 3. Normalise + weight, RoPE, store (VEC channels per thread).
  [[maybe_unused]] const int64_t out = int64_t(s_dst) * d;  // first value index of the row in the pool (f32/bf16)
  // FP8 (a.pool_dtype == kFp8): a template parameter, so the f32 / bf16 kernels compile as
  // before this path existed (same registers, no new spills).
  [[maybe_unused]] const KvFp8Layout L = FP8 ? kv_fp8_layout(d, rd) : KvFp8Layout{};
  [[maybe_unused]] uint8_t* const fp8_row = FP8 ? static_cast<uint8_t*>(a.pool) + int64_t(s_dst) * L.bytes : nullptr;
  auto normed = [&](int l) {  // channel l of the slice, normalised · norm
    const float w = pl.stage ? s_norm[l] : (a.norm ? __ldg(a.norm + c0 + l) : 1.f);
    return s_row[l] * inv * w;
  };
  for (int l = tid * VEC; l < cw; l += nt * VEC) {
    float o[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int li = l + i, ch = c0 + li;
      if (ch < nope) {
        o[i] = normed(li);
        continue;
      }
      const int q = (ch - nope) >> 1;
      const int l0 = nope + 2 * q - c0;  // first channel of the pair, slice-local
      const float x0 = normed(l0), x1 = normed(l0 + 1);
      const float f = pl.stage ? s_freq[q - q_lo] : __ldg(a.inv_freq + q);
      o[i] = cs_rope_value(x0, x1, f, pos, a.attention_scaling, ((ch - nope) & 1) != 0);
    }
    if constexpr (FP8) {
      // fp8 rows: nope values back into s_row (in place: a nope channel is read by its owner
      // only; RoPE reads rope channels), quantized below once the block amaxes are known; rope
      // values stored now as bf16 (no scale needed).
#pragma unroll
      for (int i = 0; i < VEC; ++i)
        if (c0 + l + i < nope) s_row[l + i] = o[i];
      store_fp8_rope<VEC>(fp8_row, L, c0 + l, nope, o);
    } else if constexpr (IDX) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) s_row[l + i] = o[i];
    } else {
      store_pool_values<VEC>(a, out + c0 + l, o);
    }
  }
  if constexpr (FP8) {
    // 4. fp8 rows (a.pool_dtype == kFp8, kv_fp8_layout(d, rd)): the amax of each 64-channel block
    // in the kCsChunk grid (a block is chunks 2b and 2b + 1; a slice starts on a chunk boundary, so
    // a block may straddle two CTAs of the cluster when the slice is 32 mod 64 channels): per-chunk
    // max of |x| over the chunk's finite nope values (one warp per chunk, xor butterfly: max is
    // exact in any order), into s_chunk (free again: every read of the Σx² chunk sums is done —
    // before the second cluster barrier, or before the barrier below when K = 1), exchanged
    // through distributed shared memory as the Σx² chunks; then each group of VEC nope channels
    // (never straddling a block: 64 % VEC == 0) takes its block's scale and codes with the shared
    // quantizer of base/kv_fp8.h (kvfp8::block_scale / quantize: the CPU's operations, so the
    // bytes equal kvfp8::quantize_row of the same f32 row).
    __syncthreads();  // every in-place nope value written
    for (int q = warp; q < nq; q += n_warps) {  // warp-uniform
      const int l = q * kCsChunk + lane;
      float v = l < cw && c0 + l < nope ? kvfp8::abs_finite(s_row[l]) : 0.f;
      for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) s_chunk[q] = v;
    }
    if (K > 1)
      cg::this_cluster().sync();  // chunk amaxes visible cluster-wide
    else
      __syncthreads();
    auto chunk_amax = [&](int q) -> float {  // chunk q of the row (q < nq_row)
      if (K > 1) return *cg::this_cluster().map_shared_rank(&s_chunk[q % cpr], unsigned(q / cpr));
      return s_chunk[q];
    };
    for (int l = tid * VEC; l < cw; l += nt * VEC) {
      const int ch = c0 + l;
      if (ch >= nope) break;  // l grows: every later group is rope too
      const int b = ch / KvFp8Layout::kBlock;
      float amax = chunk_amax(2 * b);
      if (2 * b + 1 < nq_row) amax = fmaxf(amax, chunk_amax(2 * b + 1));
      const float scale = kvfp8::block_scale(amax);
      if constexpr (VEC == 4) {
        if (ch + 3 < nope) {  // 4-byte store: ch % 4 == 0, rows 16-byte aligned (L.bytes % 16 == 0)
          const uint32_t w = uint32_t(kvfp8::quantize(s_row[l], scale)) |
                             (uint32_t(kvfp8::quantize(s_row[l + 1], scale)) << 8) |
                             (uint32_t(kvfp8::quantize(s_row[l + 2], scale)) << 16) |
                             (uint32_t(kvfp8::quantize(s_row[l + 3], scale)) << 24);
          *reinterpret_cast<uint32_t*>(fp8_row + ch) = w;
        } else {
          for (int i = 0; i < VEC && ch + i < nope; ++i)
            fp8_row[ch + i] = kvfp8::quantize(s_row[l + i], scale);
        }
      } else {
        fp8_row[ch] = kvfp8::quantize(s_row[l], scale);
      }
      if (ch % KvFp8Layout::kBlock == 0)  // the block's first channel writes its scale
        *reinterpret_cast<float*>(fp8_row + L.scale_off + 4 * b) = scale;
    }
    if (rank == 0) {  // padding bytes (zeros, as the CPU's quantize_row)
      for (int o = L.nope + tid; o < L.scale_off; o += nt) fp8_row[o] = 0;
      for (int o = L.scale_off + 4 * L.n_scales + tid; o < L.rope_off; o += nt) fp8_row[o] = 0;
      for (int o = L.rope_off + 2 * L.rope + tid; o < L.bytes; o += nt) fp8_row[o] = 0;
    }
    if (K > 1) cg::this_cluster().sync();  // remote reads done before any CTA of the cluster exits
  }
  if constexpr (IDX) {
    // 5. fp8 indexer-key rows (kv_fp8_index_layout(d): d codes at 0, the f32 scale at d, zero
    // padding to 16 bytes; rows 16-byte aligned): per-chunk max of |x| over the chunk's finite values (one warp
    // per chunk, xor butterfly: max is exact in any order) into s_chunk (free again, as in step
    // 4), exchanged over the cluster; every thread forms the row amax over all nq_row chunks
    // (the same value everywhere), block_scale, then each group of 4 channels one 4-byte store
    // of kvfp8::quantize codes; rank 0 thread 0 stores the scale and the padding.
    static_assert(!FP8 && VEC == 4, "fp8 indexer rows: vector path, not with FP8");
    const KvFp8IndexLayout IL = kv_fp8_index_layout(d);
    uint8_t* const idx_row = static_cast<uint8_t*>(a.pool) + int64_t(s_dst) * IL.bytes;
    __syncthreads();  // every in-place value written
    for (int q = warp; q < nq; q += n_warps) {  // warp-uniform
      const int l = q * kCsChunk + lane;
      float v = l < cw ? kvfp8::abs_finite(s_row[l]) : 0.f;
      for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) s_chunk[q] = v;
    }
    if (K > 1)
      cg::this_cluster().sync();  // chunk amaxes visible cluster-wide
    else
      __syncthreads();
    float amax = 0.f;
    for (int q = 0; q < nq_row; ++q)
      amax = fmaxf(amax, K > 1 ? *cg::this_cluster().map_shared_rank(&s_chunk[q % cpr],
                                                                     unsigned(q / cpr))
                               : s_chunk[q]);
    const float scale = kvfp8::block_scale(amax);
    for (int l = tid * VEC; l < cw; l += nt * VEC) {
      const uint32_t w = uint32_t(kvfp8::quantize(s_row[l], scale)) |
                         (uint32_t(kvfp8::quantize(s_row[l + 1], scale)) << 8) |
                         (uint32_t(kvfp8::quantize(s_row[l + 2], scale)) << 16) |
                         (uint32_t(kvfp8::quantize(s_row[l + 3], scale)) << 24);
      *reinterpret_cast<uint32_t*>(idx_row + c0 + l) = w;  // c0 + l ≡ 0 mod 4, rows 4-aligned
    }
    if (rank == 0 && tid == 0) {
      *reinterpret_cast<float*>(idx_row + IL.scale_off) = scale;
      for (int b = IL.scale_off + 4; b < IL.bytes; b += 4) *reinterpret_cast<uint32_t*>(idx_row + b) = 0;
    }
    if (K > 1) cg::this_cluster().sync();  // remote reads done before any CTA of the cluster exits
  }
}

// Row-warp form of the rows kernel for small windows and rows (plan_compress_rows_warp: c·m ≤ 8
// slots, d ≤ 128 channels, d % 32 == 0; the indexer's C4 d128 compressor): one WARP per output
// row, no shared memory, no barrier. Lane l owns channels [4l, 4l + 4) (lanes ≥ d / 4 idle); it
// issues every load of the row's ≤ 8 slots at once (kv, gate, bias: 24 float4 in flight), folds
// them into the base plan's partitions (slots [4p, 4p + 4), one batch each: cs_fold_batch) and
// merges them in order (cs_merge), so the pooled values are the base plan's bits. Σx² in the
// kCsChunk order of cs_row_sumsq, spelled with shuffles: chunk q = channels [32q, 32q + 32) lies in
// lanes 8q … 8q + 7, its 32-leaf butterfly (xor 16, 8, 4 → lane xor 4, 2, 1; xor 2, 1 → inside
// the lane's 4 values) gives the same sum; the row total = (c0 + c2) + (c1 + c3), which is the
// 32-lane butterfly of [c0, c1, c2, c3, 0, …] (adding zeros is exact). RMSNorm · norm, RoPE
// (cs_rope_value; a pair never straddles lanes: nope even), one 16-byte (f32), 8-byte (bf16) or
// 4-byte (fp8 indexer codes, IDX: row amax by a max butterfly, kvfp8::block_scale) store per lane.
// RING (one-launch form): the first ring_ctas CTAs refresh the ring (ring_copy_items), as in the
// rows kernel. Every index / parameter load before the PDL wait, as there.
template <bool RING, bool IDX>
__global__ void __launch_bounds__(256, 2)
    compress_rows_warp_kernel(ops::CompressFusedArgs a, int parts, int64_t ring_ctas, bool floor) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (RING && int64_t(blockIdx.x) < ring_ctas) {
    if (floor) {
      pdl_wait();
      pdl_trigger();
      return;
    }
    ring_copy_items<4>(a, int64_t(blockIdx.x) * kRingPerThread * nt, tid, nt);
    return;
  }
  const int lane = tid & 31;
  const int64_t r = (int64_t(blockIdx.x) - (RING ? ring_ctas : 0)) * (nt >> 5) + (tid >> 5);
  const bool live = r < a.n_out;  // warp-uniform
  const int d = a.dim, ns = a.overlap * a.ratio, rd = a.rope_dim, nope = d - rd;
  const int ch = lane * 4;
  const bool mine = ch < d;
  // Round 1: indices and parameters (never written by the kernel issued right before: ops.h).
  int32_t my_slot = -1, dst = -1;
  float pos = 0.f, w[4] = {1.f, 1.f, 1.f, 1.f}, f[2] = {0.f, 0.f};
  if (live) {
    if (lane < ns) my_slot = __ldg(a.src + r * ns + lane);
    dst = __ldg(a.dst + r);
    if (rd > 0) pos = float(__ldg(a.positions + r));
    if (mine) {
      if (a.norm) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(a.norm + ch));
        w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
      }
      for (int k = 0; k < 2; ++k)
        if (ch + 2 * k >= nope) f[k] = __ldg(a.inv_freq + (ch + 2 * k - nope) / 2);
    }
  }
  pdl_wait();
  pdl_trigger();
  if (!live || dst < 0 || floor) return;  // warp-uniform (dst is the same in every lane)

  // 1. Pooling: every load of the row first, then the partitions folded and merged.
  int32_t sl[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) sl[j] = __shfl_sync(0xffffffffu, my_slot, j);
  const CsInputs in{a.fresh_kv, a.fresh_gate, a.state_kv, a.state_gate, a.bias, a.ratio, a.overlap, d};
  float x[4] = {0.f, 0.f, 0.f, 0.f};
  if (mine) {
    CsVec<4> lg[8], kv[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) cs_load_slot<4>(in, sl, u, ns, ch, lg[u], kv[u]);
    CsAcc st[2][4];
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) st[p][i] = CsAcc{-INFINITY, 0.f, 0.f};
    cs_fold_batch<4, 4>(lg, kv, st[0]);
    if (parts > 1) cs_fold_batch<4, 4>(lg + 4, kv + 4, st[1]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float mx[2] = {st[0][i].mx, st[1][i].mx}, sm[2] = {st[0][i].sum, st[1][i].sum},
                  ac[2] = {st[0][i].acc, st[1][i].acc};
      x[i] = cs_merge(mx, sm, ac, parts, 1);
    }
  }
  // 2. Σx² (kCsChunk order, see above) and RMSNorm.
  float sq[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sq[i] = __fmul_rn(x[i], x[i]);  // 0 in idle lanes
    for (int o = 4; o; o >>= 1) sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], o);
  }
  const float chunk = (sq[0] + sq[2]) + (sq[1] + sq[3]);  // chunk lane / 8 (same in its 8 lanes)
  const float c0 = __shfl_sync(0xffffffffu, chunk, 0), c1 = __shfl_sync(0xffffffffu, chunk, 8),
              c2 = __shfl_sync(0xffffffffu, chunk, 16), c3 = __shfl_sync(0xffffffffu, chunk, 24);
  const float total = (c0 + c2) + (c1 + c3);
  const float inv = rsqrtf(total / float(int64_t(d)) + a.eps);
  // 3. Normalise + weight, RoPE.
  float o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = x[i] * inv * w[i];
#pragma unroll
  for (int k = 0; k < 2; ++k)
    if (ch + 2 * k >= nope) {
      const float x0 = o[2 * k], x1 = o[2 * k + 1];
      o[2 * k] = cs_rope_value(x0, x1, f[k], pos, a.attention_scaling, false);
      o[2 * k + 1] = cs_rope_value(x0, x1, f[k], pos, a.attention_scaling, true);
    }
  // 4. Store.
  if constexpr (IDX) {
    const KvFp8IndexLayout IL = kv_fp8_index_layout(d);
    uint8_t* const idx_row = static_cast<uint8_t*>(a.pool) + int64_t(dst) * IL.bytes;
    float amax = 0.f;
    if (mine)
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = fmaxf(amax, kvfp8::abs_finite(o[i]));
    for (int s = 16; s; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    const float scale = kvfp8::block_scale(amax);
    if (mine)
      *reinterpret_cast<uint32_t*>(idx_row + ch) = uint32_t(kvfp8::quantize(o[0], scale)) |
                                                   (uint32_t(kvfp8::quantize(o[1], scale)) << 8) |
                                                   (uint32_t(kvfp8::quantize(o[2], scale)) << 16) |
                                                   (uint32_t(kvfp8::quantize(o[3], scale)) << 24);
    if (lane == 0) {
      *reinterpret_cast<float*>(idx_row + IL.scale_off) = scale;
      for (int b = IL.scale_off + 4; b < IL.bytes; b += 4) *reinterpret_cast<uint32_t*>(idx_row + b) = 0;
    }
  } else {
    if (mine) store_pool_values<4>(a, int64_t(dst) * d + ch, o);
  }
}

// state[ring_dst[i]] = fresh[ring_src[i]] for kv and gate (two-launch form: after the rows kernel
// in stream order, i.e. after every state read of the pooling). kRingPerThread items per thread.
template <int RV>
__global__ void compress_ring_kernel(ops::CompressFusedArgs a) {
  ring_copy_items<RV>(a, int64_t(blockIdx.x) * kRingPerThread * blockDim.x, threadIdx.x,
                      blockDim.x);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Programmatic dependent launch on (default) unless V4_COMPRESS_PDL=0 (A/B runs, or a driver
// that refuses the attribute). Read at every call (a getenv per launch: negligible; lets the
// benchmark switch it between variants).
bool use_pdl() {
  const char* e = std::getenv("V4_COMPRESS_PDL");
  return !(e && e[0] == '0');
}

// V4_COMPRESS_UNROLL=4 / =8: load batches of 4 / 8 slots whatever the plan says (8 only on the
// vector path; A/B runs; results move by rounding only). 0 = the plan's choice. Read at every
// call, as use_pdl.
int forced_unroll() {
  const char* e = std::getenv("V4_COMPRESS_UNROLL");
  return e && e[0] == '4' ? 4 : e && e[0] == '8' ? 8 : 0;
}

// Wide plans (plan_compress_rows_wide: more, smaller CTAs per row, every slot load of a thread in
// flight at once; the same rows bit for bit). Off by default: on the H200 they were slower than
// the base plan in decode (batch 64 C4 d512 6.33 vs 5.84 µs, indexer 5.27 vs 4.53; batch 1 6.08
// vs 5.62; bench/results/cuda-compressor.md at c12b7f3). V4_COMPRESS_WIDE=1: the wide plan for
// every call (tests, A/B); =auto: for decode-sized grids (compress_wide_fits). Read at every call.
bool use_wide(int64_t n_out, const CompressRowsPlan& wide) {
  const char* e = std::getenv("V4_COMPRESS_WIDE");
  if (e && e[0] == '1') return true;
  if (e && std::strcmp(e, "auto") == 0) return compress_wide_fits(n_out, wide);
  return false;
}

// V4_COMPRESS_RING_ROUNDS=R (A/B runs): the one-launch rows kernel gets R times fewer ring CTAs,
// each copying R chunks of ring items in turn (the same copies). Read at every call.
int64_t ring_rounds() {
  const char* e = std::getenv("V4_COMPRESS_RING_ROUNDS");
  const int r = e ? std::atoi(e) : 1;
  return r >= 1 && r <= 64 ? r : 1;
}

// V4_COMPRESS_FLOOR=1 (benchmark diagnostic only: the results are NOT computed): every CTA of the
// same grid does its first round of index loads, the PDL wait and trigger, and exits — the
// latency floor of one call with this launch shape. Read at every call.
bool floor_only() {
  const char* e = std::getenv("V4_COMPRESS_FLOOR");
  return e && e[0] == '1';
}

// Fewest output rows for which compress_fused takes the row-warp kernel by default. On the H200
// (bench/results/cuda-compressor.md, session 20) it wins at prefill sizes (8K indexer: 6.85 vs
// 9.78 µs) and loses ~0.3–0.5 µs in decode (batch 64: 5.02 vs 4.54 µs; one warp per row is a
// longer critical path than the rows kernel's two warps). Its rows are the rows kernel's bits,
// so choosing by row count keeps batch invariance.
constexpr int64_t kRowWarpMinRows = 256;

// The row-warp kernel (compress_rows_warp_kernel) for a call whose base plan is `base`: for shapes
// it computes bit-identically (vector path, one CTA per row, ≤ 8 slots in partitions of 4 slots
// with one load batch each, d % 32 == 0 and d ≤ 128: the indexer's C4 d128) and pools it stores
// (f32, bf16, fp8 indexer keys), when n_out ≥ kRowWarpMinRows. V4_COMPRESS_ROWWARP=0: never,
// =1: whatever n_out (A/B runs, tests; read at every call).
bool use_row_warp(const ops::CompressFusedArgs& a, const CompressRowsPlan& base) {
  const char* e = std::getenv("V4_COMPRESS_ROWWARP");
  if (e && e[0] == '0') return false;
  if (!(e && e[0] == '1') && a.n_out < kRowWarpMinRows) return false;
  const int ns = a.overlap * a.ratio;
  return base.threads > 0 && base.vec == 4 && base.ctas == 1 && base.spp == 4 &&
         base.unroll == 4 && !base.prefetch && base.parts <= 2 && ns <= 8 && base.parts * 4 >= ns &&
         a.dim % kCsChunk == 0 && a.dim <= 128 &&
         (a.pool_dtype == KvDtype::kF32 || a.pool_dtype == KvDtype::kBf16 ||
          a.pool_dtype == KvDtype::kFp8Index);
}

// Ring CTAs of a one-launch grid (the ring refresh as extra CTAs in front of the pooling ones):
// the ring items (n_ring rows × kv and gate × c·d / vec columns) at kRingPerThread a thread,
// `threads` a CTA, `rounds` chunks a CTA, rounded up to whole clusters of `cluster` CTAs (a
// cluster is all-ring or all-pooling).
int64_t ring_cta_count(const ops::CompressFusedArgs& a, int vec, int threads, int64_t rounds,
                       int cluster) {
  const int64_t items = a.n_ring * 2 * (int64_t(a.overlap) * a.dim / vec);  // vec: width % vec == 0
  const int64_t per = int64_t(kRingPerThread) * threads * rounds;
  const int64_t ctas = (items + per - 1) / per;
  return (ctas + cluster - 1) / cluster * cluster;
}

// Launches `kern` with an optional cluster dimension and the PDL attribute.
template <typename Kern, typename... Args>
Status launch(Kern kern, unsigned grid, unsigned threads, size_t smem, unsigned cluster,
              cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (use_pdl()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  V4_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, args...));
  return Status::Ok();
}

using Kern = void (*)(ops::CompressFusedArgs, CompressRowsPlan, int64_t, bool);

// The fp8 indexer-key instance of a vector plan `pl` (kFp8Index pools; nullptr for scalar plans).
Kern rows_kernel_idx(const CompressRowsPlan& pl, bool one) {
  if (pl.vec != 4) return nullptr;
  if (pl.prefetch)
    return one ? compress_fused_rows_kernel<4, 4, true, true, false, true>
               : compress_fused_rows_kernel<4, 4, false, true, false, true>;
  return pl.unroll == 8 ? (one ? compress_fused_rows_kernel<4, 8, true, false, false, true>
                               : compress_fused_rows_kernel<4, 8, false, false, false, true>)
                        : (one ? compress_fused_rows_kernel<4, 4, true, false, false, true>
                               : compress_fused_rows_kernel<4, 4, false, false, false, true>);
}

// The rows kernel instance of plan `pl` (one: the one-launch form with ring CTAs; FP8: fp8 pool).
template <bool FP8>
Kern rows_kernel(const CompressRowsPlan& pl, bool one) {
  if (pl.vec == 4 && pl.prefetch)
    return one ? compress_fused_rows_kernel<4, 4, true, true, FP8>
               : compress_fused_rows_kernel<4, 4, false, true, FP8>;
  if (pl.vec == 4 && pl.more_regs && pl.unroll == 4)
    return one ? compress_fused_rows_kernel<4, 4, true, false, FP8, false, true>
               : compress_fused_rows_kernel<4, 4, false, false, FP8, false, true>;
  if (pl.vec == 4)
    return pl.unroll == 8 ? (one ? compress_fused_rows_kernel<4, 8, true, false, FP8>
                                 : compress_fused_rows_kernel<4, 8, false, false, FP8>)
                          : (one ? compress_fused_rows_kernel<4, 4, true, false, FP8>
                                 : compress_fused_rows_kernel<4, 4, false, false, FP8>);
  return one ? compress_fused_rows_kernel<1, 4, true, false, FP8>
             : compress_fused_rows_kernel<1, 4, false, false, FP8>;
}

// The vector path: d % 4 == 0 and every row pointer 16-byte aligned.
bool vector_ok(const ops::CompressFusedArgs& a) {
  return a.dim % 4 == 0 && aligned16(a.fresh_kv) && aligned16(a.fresh_gate) &&
         aligned16(a.state_kv) && aligned16(a.state_gate) && aligned16(a.bias) &&
         aligned16(a.pool);
}

// Fewest closing rows for which a rows_close call of a 256-thread cluster plan runs 128-thread
// CTAs (rows_plan): 56 rows of 8-CTA clusters plus the ring clusters still fit the H200's 62
// resident clusters of 256-thread CTAs (64 registers); from there the grid needs a second wave.
constexpr int64_t kHalfCtaMinRows = 56;

// The rows kernel's plan for `a` (base, or wide per V4_COMPRESS_WIDE; V4_COMPRESS_UNROLL forces
// the load batch on the vector path: A/B runs, 8 on base plans only).
CompressRowsPlan rows_plan(const ops::CompressFusedArgs& a, bool vec_ok) {
  const int fu = forced_unroll();
  const CompressRowsPlan wide = plan_compress_rows_wide(a.ratio, a.overlap, a.dim, vec_ok);
  CompressRowsPlan pl = use_wide(a.n_out, wide) && fu != 8
                            ? wide
                            : plan_compress_rows(a.ratio, a.overlap, a.dim, vec_ok);
  if (fu != 0 && pl.vec == 4) pl.unroll = fu;
  // V4_COMPRESS_CTAS=K (A/B runs): K CTAs per row on the vector path (threads then walk several
  // channel groups of their slice); the same bits (per-channel arithmetic and the Σx² order do
  // not depend on K).
  if (const char* e = std::getenv("V4_COMPRESS_CTAS"); e && pl.vec == 4 && pl.threads > 0) {
    const int k = std::atoi(e);
    if (k >= 1 && k <= 8) {
      CompressRowsPlan q = pl;
      q.ctas = std::min(k, q.groups);
      compress_plan_slices(q);
      q.smem = compress_rows_smem(a.overlap * a.ratio, q.parts, q.gpc * q.vec, q.stage).total;
      if (q.smem <= kCompressSmemLimit && (q.gpc * q.vec + kCsChunk - 1) / kCsChunk <= kCsMaxChunks)
        pl = q;  // else the plan's own K (the slice would not fit a CTA)
    }
  }
  // Calls whose rows all close (CompressFusedArgs::rows_close: host-planned prefill chunks) with a
  // cluster plan of 256-thread CTAs (C128: 8 CTAs × 16 groups × 16 partitions) run 128-thread
  // CTAs instead, each thread walking two groups of its slice: the same bits (the per-channel
  // arithmetic and the Σx² order do not depend on the thread count), and 8 CTAs of 64 registers
  // fit an SM where 4 did, so the prefill-8K grid (512 pooling + 32 ring CTAs; 62 clusters of 8
  // resident) runs in one wave: 19.1 → 17.5 µs on the H200 (cuda-compressor-envs-s21.md). Not for
  // decode steps: their one closing cluster then walks 4 load batches instead of 2 (batch 64:
  // 7.2 → 9.5 µs), nor for short chunks (fewer than kHalfCtaMinRows rows: their 256-thread grid
  // is one wave already and the shorter per-thread chain wins).
  const bool half_cta = a.rows_close && a.n_out >= kHalfCtaMinRows && pl.vec == 4 &&
                        pl.ctas > 1 && pl.threads == kCompressMaxThreads && pl.gw % 2 == 0 &&
                        !pl.prefetch;
  if (half_cta) {
    pl.gw /= 2;
    pl.threads = (pl.gw * pl.parts + 31) / 32 * 32;
    pl.more_regs = true;  // ~4 of these CTAs per SM: registers to spare (no spills)
  }
  // V4_COMPRESS_MORE_REGS=0 / =1: the 64- / ≤ 85-register instance for every call of the vector
  // path with 4-slot batches (A/B runs, tests; the same bits).
  if (const char* e = std::getenv("V4_COMPRESS_MORE_REGS"); e && (e[0] == '0' || e[0] == '1'))
    pl.more_regs = e[0] == '1';
  // The PDL trigger after the pooling loads (CompressRowsPlan::late_trigger) for rows_close calls
  // (prefill chunks; session 21): on the H200 the early trigger let the next grid's CTAs take SM
  // slots while this grid still ran — C128 prefill 8K 17.42 → 16.95 µs, C4 d512 prefill 29.67 →
  // 28.77 (cuda-compressor-envs-s21.md, run 3). Decode steps keep the early trigger: in the kernel
  // bench it moved them by ≤ 0.2 µs either way, and their dependents' launch latency is what
  // the early trigger hides in a decode graph (not measured end to end with the late one).
  // No explicit trigger at all (CompressRowsPlan::exit_trigger: the next kernel is scheduled as
  // this grid's CTAs exit) for the 128-thread CTAs above in the one-launch form (compress_fused
  // clears it for the two-launch form, whose ring kernel would then wait for the last pooling
  // CTA): C128 prefill 8K 16.30 → 14.37 µs on the H200, 73% → 83% of a same-size memcpy
  // (cuda-compressor-envs-s22.md); with the trigger after the loads the next call's CTAs still
  // took slots of this grid's clusters. Not for the other rows_close calls: C4 d512 prefill 8K
  // ran 30.12 µs without a trigger against 28.77 with the late one (cuda-compressor-s22.md).
  // V4_COMPRESS_LATE_TRIGGER=1 / =0 / =2: late / early / none for every call (A/B).
  {
    const char* e = std::getenv("V4_COMPRESS_LATE_TRIGGER");
    const bool forced = e && (e[0] == '0' || e[0] == '1' || e[0] == '2');
    pl.late_trigger = forced ? e[0] == '1' : a.rows_close;
    pl.exit_trigger = forced ? e[0] == '2' : half_cta;
  }
  // V4_COMPRESS_THREADS=T (A/B runs): T / P thread columns per CTA whatever the call (threads
  // walk more groups of their slice; the same bits).
  if (const char* e = std::getenv("V4_COMPRESS_THREADS"); e && pl.vec == 4 && pl.threads > 0) {
    const int t = std::atoi(e);
    if (t >= 32 && t <= kCompressMaxThreads && t % 32 == 0 && t >= pl.parts) {
      pl.gw = std::max(1, std::min(pl.gpc, t / pl.parts));
      pl.threads = (pl.gw * pl.parts + 31) / 32 * 32;
    }
  }
  return pl;
}

}  // namespace

bool compress_fused_takes_row_warp(const ops::CompressFusedArgs& a) {
  if (a.dim < 1 || a.ratio < 1 || (a.overlap != 1 && a.overlap != 2)) return false;
  const CompressRowsPlan pl = rows_plan(a, vector_ok(a));
  return forced_unroll() == 0 && !pl.prefetch && use_row_warp(a, pl);
}

bool compress_fused_index_fp8_ok(const ops::CompressFusedArgs& a) {
  return a.dim > 0 && a.dim % 16 == 0 && a.rope_dim % 2 == 0 && aligned16(a.fresh_kv) &&
         aligned16(a.fresh_gate) && aligned16(a.state_kv) && aligned16(a.state_gate) &&
         aligned16(a.bias) && aligned16(a.pool);
}

Status compress_fused(const ops::CompressFusedArgs& a, cudaStream_t stream) {
  const int d = a.dim;
  if (d < 1 || a.ratio < 1 || (a.overlap != 1 && a.overlap != 2) || a.rope_dim < 0 ||
      a.rope_dim % 2 || a.rope_dim > d)
    return errorf(ErrorCode::kInvalidArgument,
                  "compress_fused: dim={} ratio={} overlap={} rope_dim={}", d, a.ratio, a.overlap,
                  a.rope_dim);
  if (a.n_out > 0x7fffffff || a.n_ring > 0x7fffffff)
    return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} output rows, {} ring rows",
                  a.n_out, a.n_ring);
  if (a.pool_dtype != KvDtype::kF32 && a.pool_dtype != KvDtype::kBf16 &&
      a.pool_dtype != KvDtype::kFp8 && a.pool_dtype != KvDtype::kFp8Index)
    return errorf(ErrorCode::kUnsupported, "compress_fused: no fused store for {} pools",
                  kv_dtype_name(a.pool_dtype));
  // fp8 indexer-key rows (kFp8Index): the vector path only (compress_fused_index_fp8_ok).
  if (a.pool_dtype == KvDtype::kFp8Index && !compress_fused_index_fp8_ok(a))
    return errorf(ErrorCode::kUnsupported,
                  "compress_fused: fp8 indexer rows need d % 16 == 0 and 16-byte aligned rows "
                  "(d {})",
                  d);
  // fp8 rows: f32 scales and bf16 rope values need a 4-byte aligned pool (the vector path, taken
  // when the pool is 16-byte aligned, also stores 4 codes / 4 rope values at once: rows are
  // multiples of 16 bytes by construction of kv_fp8_layout).
  if (a.pool_dtype == KvDtype::kFp8 && (kv_fp8_layout(d, a.rope_dim).bytes % 16 != 0 ||
                                         (reinterpret_cast<uintptr_t>(a.pool) & 3) != 0))
    return errorf(ErrorCode::kInvalidArgument, "compress_fused: fp8 pool not 4-byte aligned");
  const int64_t width = int64_t(a.overlap) * d;
  bool ring_done = a.n_ring == 0;
  if (a.n_out > 0) {
    const bool vec_ok = vector_ok(a);
    const int fu = forced_unroll();
    CompressRowsPlan pl = rows_plan(a, vec_ok);
    if (pl.threads == 0)
      return errorf(ErrorCode::kInvalidArgument, "compress_fused: dim {} too large", d);
    if (fu == 0 && !pl.prefetch && use_row_warp(a, pl)) {  // compress_fused_takes_row_warp
      // One warp per row, 8 rows per CTA; ring CTAs first in the one-launch form.
      constexpr int kRowsPerCta = 8;
      const bool one = a.ring_disjoint && a.n_ring > 0;
      const int64_t ring_ctas = one ? ring_cta_count(a, 4, 256, 1, 1) : 0;
      const int64_t grid = (a.n_out + kRowsPerCta - 1) / kRowsPerCta + ring_ctas;
      if (grid > 0x7fffffff)
        return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} output rows", a.n_out);
      const bool idx = a.pool_dtype == KvDtype::kFp8Index;
      auto kern = one ? (idx ? compress_rows_warp_kernel<true, true>
                             : compress_rows_warp_kernel<true, false>)
                      : (idx ? compress_rows_warp_kernel<false, true>
                             : compress_rows_warp_kernel<false, false>);
      V4_RETURN_IF_ERROR(launch(kern, unsigned(grid), 256u, 0, 1u, stream, a, pl.parts, ring_ctas,
                                floor_only()));
      ring_done = ring_done || one;
    } else {
      if (pl.threads > kCompressMaxThreads || pl.smem > kCompressSmemLimit || pl.ctas > 8 ||
          (pl.ctas > 1 && (pl.gpc * pl.vec) % kCsChunk != 0) ||
          (pl.gpc * pl.vec + kCsChunk - 1) / kCsChunk > kCsMaxChunks ||
          (pl.prefetch && (pl.unroll != 4 || pl.spp > 8)))
        return errorf(ErrorCode::kInternal,
                      "compress_fused: plan of {} threads, {} B, {} CTAs of {} groups, spp {}",
                      pl.threads, pl.smem, pl.ctas, pl.gpc, pl.spp);
      // One launch when the caller promises that no refreshed ring row is a state slot of a window
      // (CompressFusedArgs::ring_disjoint): ring CTAs first in the grid, whole clusters of them.
      const bool one = a.ring_disjoint && a.n_ring > 0;
      if (!one && a.n_ring > 0 && !std::getenv("V4_COMPRESS_LATE_TRIGGER")) pl.exit_trigger = false;
      const int64_t ring_ctas =
          one ? ring_cta_count(a, pl.vec, pl.threads, ring_rounds(), pl.ctas) : 0;
      const int64_t grid = a.n_out * pl.ctas + ring_ctas;
      if (grid > 0x7fffffff)
        return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} output rows", a.n_out);
      const Kern kern = a.pool_dtype == KvDtype::kFp8        ? rows_kernel<true>(pl, one)
                        : a.pool_dtype == KvDtype::kFp8Index ? rows_kernel_idx(pl, one)
                                                             : rows_kernel<false>(pl, one);
      if (!kern)
        return errorf(ErrorCode::kInternal, "compress_fused: no kernel for plan vec {} ({} pools)",
                      pl.vec, kv_dtype_name(a.pool_dtype));
      V4_RETURN_IF_ERROR(launch(kern, unsigned(grid), unsigned(pl.threads), pl.smem,
                                unsigned(pl.ctas), stream, a, pl, ring_ctas, floor_only()));
      ring_done = ring_done || one;
    }
  }
  if (!ring_done) {
    // Two-launch form: stream order puts the refresh after every state read of the pooling.
    const bool vec = width % 4 == 0 && aligned16(a.fresh_kv) && aligned16(a.fresh_gate) &&
                     aligned16(a.state_kv) && aligned16(a.state_gate);
    constexpr int kThreads = 256;
    const int64_t items = a.n_ring * 2 * (vec ? width / 4 : width);
    const int64_t blocks = (items + int64_t(kRingPerThread) * kThreads - 1) /
                           (int64_t(kRingPerThread) * kThreads);
    if (blocks > 0x7fffffff)
      return errorf(ErrorCode::kInvalidArgument, "compress_fused: {} ring rows", a.n_ring);
    if (vec)
      V4_RETURN_IF_ERROR(
          launch(compress_ring_kernel<4>, unsigned(blocks), kThreads, 0, 1, stream, a));
    else
      V4_RETURN_IF_ERROR(
          launch(compress_ring_kernel<1>, unsigned(blocks), kThreads, 0, 1, stream, a));
  }
  return Status::Ok();
}

}  // namespace v4::cuda
