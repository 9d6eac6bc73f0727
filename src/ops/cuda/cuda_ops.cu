#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// CUDA implementation of ops::Ops (see cuda_ops.h). Every kernel computes an output element with
// a fixed summation order that does not depend on the number of rows in the call, so results are
// batch-invariant like the CPU backend's (not bit-equal to it: FMA contraction and reduction trees
// differ; tests/cuda compares within fp32 tolerance).

#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/log.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_dec.h"
#include "ops/cuda/compress_pool.cuh"
#include "ops/cuda/compressor.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_plan.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/fill.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/mhc.h"
#include "ops/cuda/dense_mma.h"
#include "ops/cuda/compress_proj.h"
#include "ops/cuda/gmoe_mma.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/norm_rope.h"
#include "ops/cuda/sampling.h"
#include "ops/cuda/topk.h"
#include "ops/cuda/wgemm.h"

namespace v4::ops {
namespace {

using cuda::grid_for;
using cuda::kv_load;

// ---- elementwise / copies -----------------------------------------------------------------------
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// pool[rows[r], c] = src[r, c] (rows[r] < 0: skipped) into a bf16 KV pool, round to nearest even
// (kv_f32_to_bf16: bit-identical to the CPU backend's store).
__global__ void store_rows_bf16_kernel(const float* __restrict__ src,
                                       const int32_t* __restrict__ rows, int64_t n, int64_t width,
                                       uint16_t* __restrict__ pool) {
  const int64_t total = n * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    const int32_t p = rows[r];
    if (p >= 0) pool[int64_t(p) * width + c] = cuda::kv_f32_to_bf16(src[i]);
  }
}

// pool row rows[i] = the fp8 row (KvFp8Layout L) of src[i, :] (rows[i] < 0: skipped); one warp
// a row. The same per-value operations as the CPU's kvfp8::quantize_row (base/kv_fp8.h): block
// amax over finite |x| (a max is exact in any order), scale = block_scale(amax), codes =
// quantize(x, scale), rope bf16_encode, every padding byte 0 — so the bytes are the CPU's.
__global__ void store_rows_fp8_kernel(const float* __restrict__ src,
                                      const int32_t* __restrict__ rows, int64_t n, int width,
                                      KvFp8Layout L, uint8_t* __restrict__ pool) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= n) return;  // whole warps
  const int32_t p = rows[i];
  if (p < 0) return;
  const float* x = src + i * width;
  uint8_t* dst = pool + int64_t(p) * L.bytes;
  for (int b = 0; b < L.n_scales; ++b) {
    const int c0 = b * KvFp8Layout::kBlock;
    const int c1 = min(c0 + KvFp8Layout::kBlock, L.nope);
    const int ca = c0 + lane, cb = c0 + 32 + lane;  // kBlock == 64: two values a lane
    const float va = ca < c1 ? x[ca] : 0.f, vb = cb < c1 ? x[cb] : 0.f;
    float m = fmaxf(kvfp8::abs_finite(va), kvfp8::abs_finite(vb));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    const float s = kvfp8::block_scale(m);
    if (ca < c1) dst[ca] = kvfp8::quantize(va, s);
    if (cb < c1) dst[cb] = kvfp8::quantize(vb, s);
    if (lane == 0) *reinterpret_cast<float*>(dst + L.scale_off + 4 * b) = s;
  }
  for (int o = L.nope + lane; o < L.scale_off; o += 32) dst[o] = 0;
  for (int o = L.scale_off + 4 * L.n_scales + lane; o < L.rope_off; o += 32) dst[o] = 0;
  for (int r = lane; r < L.rope; r += 32)
    reinterpret_cast<uint16_t*>(dst + L.rope_off)[r] = kvfp8::bf16_encode(x[L.nope + r]);
  for (int o = L.rope_off + 2 * L.rope + lane; o < L.bytes; o += 32) dst[o] = 0;
}

// pool row rows[i] = the fp8 indexer-key row (KvFp8IndexLayout L: L.n codes + one f32 scale) of
// src[i, :] (rows[i] < 0: skipped); one warp a row. The operations of the CPU's
// kvfp8::quantize_index_row: amax over every finite |x| of the row (max: exact in any order),
// scale = block_scale(amax), codes = quantize(x, scale), zero padding — so the bytes are the
// CPU's. Rows are L.bytes (a multiple of 16: L.n % 16 == 0, checked by the host; the kernel
// needs only a 4-byte aligned pool for the scale), codes stored bytewise.
__global__ void store_rows_fp8_index_kernel(const float* __restrict__ src,
                                            const int32_t* __restrict__ rows, int64_t n,
                                            KvFp8IndexLayout L, uint8_t* __restrict__ pool) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= n) return;  // whole warps
  const int32_t p = rows[i];
  if (p < 0) return;
  const float* x = src + i * L.n;
  uint8_t* dst = pool + int64_t(p) * L.bytes;
  float m = 0.f;
  for (int c = lane; c < L.n; c += 32) m = fmaxf(m, kvfp8::abs_finite(x[c]));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float s = kvfp8::block_scale(m);
  for (int c = lane; c < L.n; c += 32) dst[c] = kvfp8::quantize(x[c], s);
  if (lane == 0) *reinterpret_cast<float*>(dst + L.scale_off) = s;
  for (int b = L.scale_off + 4 + lane; b < L.bytes; b += 32) dst[b] = 0;
}

// dst[i] = src[rows[i]] (gather) or pool[rows[i]] = src[i] (scatter, rows < 0 skipped).
__global__ void rows_copy_kernel(const float* __restrict__ src, const int32_t* __restrict__ rows,
                                 int64_t n, int64_t width, float* __restrict__ dst, bool scatter) {
  const int64_t total = n * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    const int32_t p = rows[r];
    if (scatter) {
      if (p >= 0) dst[int64_t(p) * width + c] = src[i];
    } else {
      dst[i] = src[int64_t(p) * width + c];
    }
  }
}

// Batched copy (Ops::copy_batch): block b copies segments b, b + gridDim.x, ... (the host splits
// segments into pieces of at most kCopyPiece bytes, so blocks get similar work). 16-byte moves
// when dst, src and the length are 16-byte aligned, else 4-byte, else single bytes.
constexpr size_t kCopyPiece = size_t(64) << 10;
__global__ void copy_batch_kernel(const CopySegment* __restrict__ segs, int64_t n) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    char* d = static_cast<char*>(segs[i].dst);
    const char* s = static_cast<const char*>(segs[i].src);
    const size_t bytes = segs[i].bytes;
    const size_t align = reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s) | bytes;
    if ((align & 15) == 0) {
      int4* d4 = reinterpret_cast<int4*>(d);
      const int4* s4 = reinterpret_cast<const int4*>(s);
      for (size_t j = threadIdx.x; j < bytes / 16; j += blockDim.x) d4[j] = s4[j];
    } else if ((align & 3) == 0) {
      int* d1 = reinterpret_cast<int*>(d);
      const int* s1 = reinterpret_cast<const int*>(s);
      for (size_t j = threadIdx.x; j < bytes / 4; j += blockDim.x) d1[j] = s1[j];
    } else {
      for (size_t j = threadIdx.x; j < bytes; j += blockDim.x) d[j] = s[j];
    }
  }
}

// out[t, s, :] = table[ids[t], :] for each of the n streams. V = float, or float4 (4 channels a
// thread: D % 4 == 0 and 16-byte aligned table / out; the scalar form took 153 µs for 2,048
// tokens × 4 streams × 4,096, ncu-kernels-s19.md). Dv = D in units of V.
template <typename V>
__global__ void embed_kernel(const V* __restrict__ table, const int32_t* __restrict__ ids,
                             int64_t S, int Dv, int n, V* __restrict__ out) {
  const int64_t total = S * n * int64_t(Dv);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % Dv, t = i / (int64_t(n) * Dv);
    out[i] = table[int64_t(ids[t]) * Dv + d];
  }
}

// ---- compressor pooling (dsv4-model.md §5), one thread per (output row, channel) ------------------
__global__ void compress_pool_kernel(CompressArgs a) {
  const int d = a.dim;
  const int64_t total = a.n_out * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / d;
    const int ch = int(i - r * d);
    a.out[r * d + ch] = cuda::compress_pool_channel(a, r, ch);
  }
}

// ---- indexer (dsv4-model.md §6) -------------------------------------------------------------------
// score[t, s] for s < count[t]: one thread per candidate, q[t] and scaled weights in shared memory;
// summation order as the CPU op (heads in order, each ReLU(q·k)·dI^-1/2 · w·nI^-1/2).
__global__ void indexer_score_kernel(IndexerArgs a, float* __restrict__ scores, int64_t ld) {
  extern __shared__ float sm[];  // q [nI·dI], w [nI]
  const int nI = a.n_heads, dI = a.head_dim;
  const int64_t t = blockIdx.y;
  const int32_t n = a.cand.count[t];
  if (int64_t(blockIdx.x) * blockDim.x >= n) return;
  const float qscale = rsqrtf(float(dI)), wscale = rsqrtf(float(nI));
  for (int i = threadIdx.x; i < nI * dI; i += blockDim.x) sm[i] = a.q[t * nI * dI + i];
  for (int i = threadIdx.x; i < nI; i += blockDim.x) sm[nI * dI + i] = a.weights[t * nI + i] * wscale;
  __syncthreads();
  if (a.key_dtype == KvDtype::kFp8Index) {
    // fp8 keys: each q head quantized and read back as the CPU op does (kvfp8::index_query_fp8;
    // the amax is a max, so the scale — and q̂ — equal the host's bit for bit). A warp a head.
    const int lane = threadIdx.x & 31;
    for (int h = threadIdx.x / 32; h < nI; h += blockDim.x / 32) {
      float amax = 0.f;
      for (int c = lane; c < dI; c += 32) amax = fmaxf(amax, kvfp8::abs_finite(sm[h * dI + c]));
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float qs = kvfp8::block_scale(amax), qinv = kvfp8::index_query_inv(qs);
      for (int c = lane; c < dI; c += 32)
        sm[h * dI + c] =
            kvfp8::dequantize(kvfp8::e4m3_encode(kvfp8::mul_rn(sm[h * dI + c], qinv)), qs);
    }
    __syncthreads();
  }
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= n) return;
  const int64_t key = int64_t(a.cand.rows[a.cand.offset[t] + s]) * dI;  // first value
  float acc = 0.f;
  if (a.key_dtype == KvDtype::kFp8Index) {
    // fp8 indexer keys (kv_fp8_index_layout(dI)): dequantized on load (code value · row scale,
    // kvfp8::dequantize), as the CPU reads them.
    const KvFp8IndexLayout L = kv_fp8_index_layout(dI);
    const uint8_t* kr = static_cast<const uint8_t*>(a.key_pool) + (key / dI) * L.bytes;
    const float ks = *reinterpret_cast<const float*>(kr + L.scale_off);
    for (int h = 0; h < nI; ++h) {
      float dsum = 0.f;
      for (int c = 0; c < dI; ++c) dsum += sm[h * dI + c] * kvfp8::dequantize(kr[c], ks);
      acc += fmaxf(0.f, dsum) * qscale * sm[nI * dI + h];
    }
    scores[t * ld + s] = acc;
    return;
  }
  for (int h = 0; h < nI; ++h) {
    float dsum = 0.f;
    for (int c = 0; c < dI; ++c) dsum += sm[h * dI + c] * kv_load(a.key_pool, a.key_dtype, key + c);
    acc += fmaxf(0.f, dsum) * qscale * sm[nI * dI + h];
  }
  scores[t * ld + s] = acc;
}

// Maps the selected candidates of each row (sel: map positions in ascending order, topk_rows'
// output) to physical pool rows, in that order (IndexerArgs: map position order); −1 padding
// after min(k, count) entries; out_count = min(k, count). One block a row. (Until 2026-11-30 this
// kernel radix-sorted the selection by (score desc, position asc) first: 13 passes over 50-bit
// keys at 230,400 candidates, most of the ~10 µs between the top-k and the chain's end,
// bench/results/cuda-indexer.md chain table.)
// PDL: launched with programmatic stream serialization (CudaOptions::indexer_pdl): lets the next
// kernel launch early (a PDL-launched one waits before reading out_rows / out_count), and every
// thread waits for the top-k grid (griddepcontrol.wait: completed, its memory visible) before its
// first global access.
template <bool PDL>
__global__ void __launch_bounds__(128) indexer_finalize_kernel(const int32_t* __restrict__ sel,
                                                               RowMap cand, int k,
                                                               int32_t* __restrict__ out_rows,
                                                               int32_t* __restrict__ out_count) {
  if constexpr (PDL) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const int64_t t = blockIdx.x;
  const int n = cand.count[t];
  const int n_sel = n < k ? n : k;
  const int32_t* rows = cand.rows + cand.offset[t];
  for (int e = threadIdx.x; e < k; e += blockDim.x)
    out_rows[t * k + e] = e < n_sel ? rows[sel[t * k + e]] : -1;
  if (threadIdx.x == 0 && out_count) out_count[t] = n_sel;
}

// ---- sparse attention with sink (dsv4-model.md §4): one warp per (row, head), online softmax ------
constexpr int kAttnMaxHd = 1024;
__global__ void attention_kernel(AttentionArgs a) {
  const int H = a.n_heads, hd = a.head_dim;
  const int64_t warp_id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp_id >= a.n_rows * H) return;
  const int64_t t = warp_id / H;
  const int h = int(warp_id % H);
  constexpr int kPer = kAttnMaxHd / 32;
  const float* q = a.q + (t * H + h) * hd;
  float qv[kPer], o[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < hd ? q[c] : 0.f;
    o[i] = 0.f;
  }
  float mx = a.sinks[h], l = 1.f;  // the sink: exp(sink − mx) with mx = sink
  auto visit = [&](const void* pool, const RowMap& map) {
    if (!pool || !map.count) return;
    const int32_t* rows = map.rows + map.offset[t];
    const int32_t cnt = map.count[t];
    for (int32_t j = 0; j < cnt; ++j) {
      const int32_t r = rows[j];
      if (r < 0) continue;
      float kv[kPer];
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = lane + 32 * i;
        kv[i] = c < hd ? cuda::kv_row_load(pool, a.kv_dtype, r, hd, c, a.rope_dim) : 0.f;
        d += qv[i] * kv[i];
      }
#pragma unroll
      for (int off = 16; off; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
      const float logit = d * a.scale;
      const float nm = fmaxf(mx, logit);
      const float corr = expf(mx - nm), p = expf(logit - nm);
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < kPer; ++i) o[i] = o[i] * corr + p * kv[i];
      mx = nm;
    }
  };
  visit(a.swa_pool, a.swa);
  visit(a.comp_pool, a.comp);
  float* out = a.out + (t * H + h) * hd;
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = lane + 32 * i;
    if (c < hd) out[c] = o[i] * inv;
  }
}

// ---- routing (dsv4-model.md §8): one thread per row ---------------------------------------------
__device__ __forceinline__ float softplus_t(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// One block per token row: scores of the E experts in shared memory (one thread per expert),
// then k rounds of a block argmax over (score + bias), excluding chosen experts; ties → lower id
// (the CPU op's order). Weights = chosen scores normalised, times routed_scaling_factor.
constexpr int kRouteThreads = 256;
constexpr int kRouteMaxK = 32;
__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouteArgs a) {
  extern __shared__ float route_s[];  // [E] scores
  __shared__ float red_v[kRouteThreads / 32];
  __shared__ int red_i[kRouteThreads / 32];
  __shared__ int chosen[kRouteMaxK];
  const int64_t t = blockIdx.x;
  const int E = a.n_experts, k = a.topk;
  const float* lg = a.logits + t * E;
  if (a.scoring == ScoringFunc::kSqrtSoftplus) {
    for (int i = threadIdx.x; i < E; i += kRouteThreads) route_s[i] = sqrtf(softplus_t(lg[i]));
  } else if (a.scoring == ScoringFunc::kSigmoid) {
    for (int i = threadIdx.x; i < E; i += kRouteThreads) route_s[i] = 1.f / (1.f + expf(-lg[i]));
  } else {
    if (threadIdx.x == 0) {  // softmax: the CPU op's sequential order
      float mx = -INFINITY;
      for (int i = 0; i < E; ++i) mx = fmaxf(mx, lg[i]);
      float sum = 0.f;
      for (int i = 0; i < E; ++i) sum += (route_s[i] = expf(lg[i] - mx));
      for (int i = 0; i < E; ++i) route_s[i] /= sum;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (a.tid2eid) {
    if (threadIdx.x < k) chosen[threadIdx.x] = a.tid2eid[int64_t(a.token_ids[t]) * k + threadIdx.x];
  } else {
    for (int j = 0; j < k; ++j) {
      // (best value, best id) of this thread's experts; id −1 = none. Higher value wins, ties →
      // lower id (the CPU op's scan); NaN ranks as −inf here (the CPU scan keeps a NaN only when
      // it is the first candidate).
      float bv = -INFINITY;
      int bi = -1;
      auto better = [](float v, int i, float bv, int bi) {
        return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
      };
      for (int i = threadIdx.x; i < E; i += kRouteThreads) {
        bool taken = false;
        for (int q = 0; q < j; ++q) taken |= chosen[q] == i;
        if (taken) continue;
        float v = route_s[i] + (a.bias ? a.bias[i] : 0.f);
        if (v != v) v = -INFINITY;
        if (better(v, i, bv, bi)) {
          bv = v;
          bi = i;
        }
      }
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, o);
        const int oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (lane == 0) {
        red_v[warp] = bv;
        red_i[warp] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float v = red_v[0];
        int id = red_i[0];
        for (int w = 1; w < kRouteThreads / 32; ++w)
          if (better(red_v[w], red_i[w], v, id)) {
            v = red_v[w];
            id = red_i[w];
          }
        chosen[j] = id;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* idx = a.out_idx + t * k;
    float sum = 0.f;
    for (int j = 0; j < k; ++j) {
      idx[j] = chosen[j];
      sum += route_s[chosen[j]];
    }
    for (int j = 0; j < k; ++j)
      a.out_weight[t * k + j] = route_s[chosen[j]] / (sum + 1e-20f) * a.routed_scaling_factor;
  }
}


// ---- the backend --------------------------------------------------------------------------------
class CudaOps final : public Ops {
 public:
  explicit CudaOps(CudaOptions opts)
      : batch_invariant_(opts.precision == Precision::kFp32), opts_(opts) {
    // A/B override of the multi-stream branches (docs/cuda.md §Multi-stream).
    if (const char* e = std::getenv("V4_MULTI_STREAM")) {
      if (std::string(e) == "1") opts_.multi_stream = true;
      if (std::string(e) == "0") opts_.multi_stream = false;
    }
    if (const char* e = std::getenv("V4_STREAM_PRIORITY")) {  // A/B of branch 3's priority
      if (std::string(e) == "1") opts_.indexer_stream_priority = true;
      if (std::string(e) == "0") opts_.indexer_stream_priority = false;
    }
    if (const char* e = std::getenv("V4_ATTN_DEC")) {
      // "0": off; "1" … "14": on with that variant (attention_dec.h); anything else: unchanged.
      const std::string v = e;
      for (int k = 1; k <= 14; ++k)
        if (v == std::to_string(k)) opts_.attention_dec = true, opts_.attention_dec_variant = k;
      if (std::string(e) == "0") opts_.attention_dec = false;
    }
    if (const char* e = std::getenv("V4_ATTN_DEC_LEAN")) {  // auto: variant 6 for variant 5
      if (std::string(e) == "1") opts_.attention_dec_lean = true;
      if (std::string(e) == "0") opts_.attention_dec_lean = false;
    }
    if (const char* e = std::getenv("V4_INDEXER_PDL")) {  // A/B of the indexer chain's PDL
      if (std::string(e) == "1") opts_.indexer_pdl = true;
      if (std::string(e) == "0") opts_.indexer_pdl = false;
    }
    if (const char* e = std::getenv("V4_INDEXER_PDL_MAX_COUNT")) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (end && *end == '\0' && end != e && v >= 0) opts_.indexer_pdl_max_count = v;
    }
    if (const char* e = std::getenv("V4_INDEXER_GATE_MIN_COUNT")) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (end && *end == '\0' && end != e && v >= 0) opts_.indexer_gate_min_count = v;
    }
    if (const char* e = std::getenv("V4_INDEXER_DEC")) {  // A/B of the indexer scores kernel
      const std::string v(e);
      int n = -1;
      if (!v.empty() && v.size() <= 2 && std::all_of(v.begin(), v.end(), [](char ch) {
            return ch >= '0' && ch <= '9';
          }))
        n = std::stoi(v);
      if (n >= 0 && n <= cuda::kIndexerScoresMaxVariant) opts_.indexer_scores_variant = n;
    }
  }
  ~CudaOps() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaStream_t& st : side_)
      if (st) {
        cudaStreamSynchronize(st);
        cudaStreamDestroy(st);
      }
    for (cudaEvent_t e : ev_join_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : ev_handoff_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : ev_xbranch_)
      if (e) cudaEventDestroy(e);
    if (ev_gate_) cudaEventDestroy(ev_gate_);
    if (ev_fork_) cudaEventDestroy(ev_fork_);
    for (auto& [sz, list] : free_)
      for (void* p : list) cudaFree(p);
    for (auto& [p, sz] : scratch_) cudaFree(p);
    for (void* p : retired_) cudaFree(p);
    for (cudaEvent_t e : {ev_begin_, ev_end_[0], ev_end_[1], ev_copy_})
      if (e) cudaEventDestroy(e);
    if (copy_host_) cudaFreeHost(copy_host_);
    if (copy_dev_) cudaFree(copy_dev_);
    for (cudaEvent_t e : eager_events_) cudaEventDestroy(e);
    for (const Mark& m : capture_marks_) cudaEventDestroy(m.ev);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status init() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      (void)cudaGetLastError();
      return cuda::errorf(ErrorCode::kUnsupported, "no CUDA device ({})", cudaGetErrorString(e));
    }
    V4_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    int dev = 0;
    V4_CUDA_TRY(cudaGetDevice(&dev));
    V4_CUDA_TRY(cudaDeviceGetAttribute(&n_sms_, cudaDevAttrMultiProcessorCount, dev));
    if (opts_.precision == Precision::kBf16) {
      V4_ASSIGN_OR_RETURN(gemm_, cuda::Gemm::create(size_t(32) << 20));
      V4_RETURN_IF_ERROR(cuda::wgemv_prepare());
      V4_RETURN_IF_ERROR(cuda::moe_mma_prepare());
      V4_RETURN_IF_ERROR(cuda::dense_mma_prepare());
      V4_RETURN_IF_ERROR(cuda::compress_proj_prepare());
      V4_RETURN_IF_ERROR(cuda::gmoe_mma_prepare());
    }
    if (opts_.multi_stream) V4_RETURN_IF_ERROR(make_side_streams());
    return Status::Ok();
  }
  // Side streams and the fork / join / scratch-handoff events, created once (never during a
  // capture: set_multi_stream refuses then).
  Status make_side_streams() {
    if (side_[0]) return Status::Ok();
    int least = 0, greatest = 0;  // numerically: greatest ≤ least (lower = more urgent)
    V4_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int i = 0; i < kStreams - 1; ++i) {
      const bool urgent = opts_.indexer_stream_priority && i + 1 == kIndexerBranch;
      V4_CUDA_TRY(cudaStreamCreateWithPriority(&side_[i], cudaStreamNonBlocking,
                                               urgent ? greatest : least));
    }
    V4_CUDA_TRY(cudaEventCreateWithFlags(&ev_fork_, cudaEventDisableTiming));
    for (cudaEvent_t& e : ev_join_) V4_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : ev_handoff_)
      V4_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (cudaEvent_t& e : ev_xbranch_)
      V4_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    V4_CUDA_TRY(cudaEventCreateWithFlags(&ev_gate_, cudaEventDisableTiming));
    return Status::Ok();
  }
  std::string name() const override { return "cuda"; }

  // Memory: small blocks (≤ 64 MiB) are cached in power-of-two size classes so per-step plan
  // buffers do not hit cudaMalloc/cudaFree (which synchronizes); large pools go straight through.
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    if (capturing_) throw std::logic_error("CudaOps::alloc during graph capture");
    if (forked_) record(Status(ErrorCode::kInternal, "CudaOps::alloc between fork and join"));
    size_t cls = bytes <= kSmallMax ? size_class(bytes) : (bytes + 255) / 256 * 256;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (cls <= kSmallMax && it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (!p) {
      if (cudaMalloc(&p, cls) != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::bad_alloc();
      }
    }
    check(cudaMemsetAsync(p, 0, cls, stream_), "alloc memset");
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = cls;
    return p;
  }
  void free(void* ptr) override {
    if (!ptr) return;
    if (capturing_) {  // a captured kernel may still use it: keep it (leak) and fail the capture
      record(Status(ErrorCode::kInternal, "CudaOps::free during graph capture"));
      return;
    }
    if (forked_) record(Status(ErrorCode::kInternal, "CudaOps::free between fork and join"));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      record(Status(ErrorCode::kInternal, "free of a pointer not from CudaOps::alloc"));
      return;
    }
    const size_t cls = it->second;
    live_.erase(it);
    if (cls <= kSmallMax) {
      free_[cls].push_back(ptr);  // reuse is stream-ordered: later work runs after earlier work
    } else {
      check(cudaStreamSynchronize(stream_), "free sync");
      check(cudaFree(ptr), "cudaFree");
    }
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    if (capturing_) return record(Status(ErrorCode::kInternal, "upload during graph capture"));
    if (forked_) record(Status(ErrorCode::kInternal, "upload between fork and join"));
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaStreamSynchronize(stream_), "upload sync");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (capturing_) return record(Status(ErrorCode::kInternal, "download during graph capture"));
    if (forked_) record(Status(ErrorCode::kInternal, "download between fork and join"));
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    synchronize();
  }
  void synchronize() override {
    if (capturing_) return record(Status(ErrorCode::kInternal, "synchronize during graph capture"));
    if (forked_) record(Status(ErrorCode::kInternal, "synchronize between fork and join"));
    check(cudaStreamSynchronize(stream_), "synchronize");
    if (!status_.ok()) throw std::runtime_error(status_.to_string());
  }

  void linear(const float* x, int64_t ldx, const float* w, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy) override {
    if (M <= 0 || N <= 0) return;
    if (opts_.precision == Precision::kBf16) {
      // f32 weights (the MoE router): the weight-streaming GEMV for M ≤ kF32GemvMaxRows (fp32
      // math, every SM busy), cuBLASLt in fp32 above (linear_w_bf16 never rounds f32 views).
      record(cuda::linear_w_bf16(x, ldx, WeightView::f32(w, N, K), M, y, ldy, context()));
    } else {
      record(cuda::wgemm_fp32(x, ldx, WeightView::f32(w, N, K), 0, M, y, ldy, cs()));
    }
  }
  bool supports(WFormat) const override { return true; }
  /// f32 and bf16 KV pools: bf16 is read by attention_dec (KeyPool<bf16>), the split kernel, the
  /// generic kernels and the indexer; attention_mma (TF32, prefill) takes f32 pools only, so bf16
  /// prefill attention runs attention_dec too (sparse_attention below).
  /// fp8 pools (rows of KvFp8Layout): stored by store_rows_fp8_kernel (SWA) and by
  /// FlashCompressor's fused fp8 store (compressed rows; V4_COMPRESS_FP8_FUSED=0: the default
  /// compress_fused composition), read by attention_dec (KeyPool<KvFp8Row>, rope_dim 64; any row count as bf16), the
  /// split kernel and the generic kernel. Their indexer keys are kFp8Index rows (e4m3 codes + one
  /// f32 scale, zero-padded to 144 bytes for V4): stored by store_rows_fp8_index_kernel and by FlashCompressor's
  /// fused store (V4_COMPRESS_FP8_FUSED=0 or a scalar plan: the default composition), read by the
  /// decode / WMMA indexer kernels (indexer.cu) and indexer_score_kernel.
  bool supports_kv_dtype(KvDtype dt) const override {
    return dt == KvDtype::kF32 || dt == KvDtype::kBf16 || dt == KvDtype::kFp8;
  }
  void linear_w_grouped(const float* x, int64_t ldx, const WeightView& w, int groups, int64_t M,
                        float* y, int64_t ldy) override {
    if (opts_.precision == Precision::kBf16) {
      record(cuda::linear_w_grouped_bf16(x, ldx, w, groups, M, y, ldy, context()));
    } else {
      Ops::linear_w_grouped(x, ldx, w, groups, M, y, ldy);
    }
  }
  void linear_w(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                int64_t ldy) override {
    if (M <= 0 || w.n <= 0) return;
    if (opts_.precision == Precision::kBf16) {
      record(cuda::linear_w_bf16(x, ldx, w, M, y, ldy, context()));
    } else {
      record(cuda::wgemm_fp32(x, ldx, w, 0, M, y, ldy, cs()));
    }
  }
  void add(float* y, const float* x, int64_t n) override {
    if (n <= 0) return;
    add_kernel<<<grid_for(n, 256), 256, 0, cs()>>>(y, x, n);
    launched("add_kernel");
  }
  void gather_rows(const float* src, const int32_t* rows, int64_t n, int64_t width,
                   float* dst) override {
    if (n <= 0 || width <= 0) return;
    rows_copy_kernel<<<grid_for(n * width, 256), 256, 0, cs()>>>(src, rows, n, width, dst, false);
    launched("gather_rows");
  }
  void store_rows(float* pool, const int32_t* rows, int64_t n, int64_t width,
                  const float* src) override {
    if (n <= 0 || width <= 0) return;
    rows_copy_kernel<<<grid_for(n * width, 256), 256, 0, cs()>>>(src, rows, n, width, pool, true);
    launched("store_rows");
  }
  void store_rows_kv(void* pool, KvDtype dtype, const int32_t* rows, int64_t n, int64_t width,
                     const float* src, int rope_dim) override {
    if (dtype == KvDtype::kF32) {
      store_rows(static_cast<float*>(pool), rows, n, width, src);
      return;
    }
    if (dtype == KvDtype::kFp8) {
      if (rope_dim < 0 || rope_dim > width || width > (int64_t(1) << 20)) {
        record(cuda::errorf(ErrorCode::kInvalidArgument,
                            "store_rows_kv: fp8 width {} rope_dim {}", width, rope_dim));
        return;
      }
      if (n <= 0) return;
      const KvFp8Layout L = kv_fp8_layout(int(width), rope_dim);
      constexpr int kWarps = 4;
      store_rows_fp8_kernel<<<unsigned((n + kWarps - 1) / kWarps), 32 * kWarps, 0, cs()>>>(
          src, rows, n, int(width), L, static_cast<uint8_t*>(pool));
      launched("store_rows_fp8");
      return;
    }
    if (dtype == KvDtype::kFp8Index) {
      if (width <= 0 || width % 16 != 0 || width > (int64_t(1) << 20) ||
          (reinterpret_cast<uintptr_t>(pool) & 3) != 0) {
        record(cuda::errorf(ErrorCode::kInvalidArgument,
                            "store_rows_kv: fp8 indexer width {} (needs % 16 == 0) or pool "
                            "not 4-byte aligned",
                            width));
        return;
      }
      if (n <= 0) return;
      constexpr int kWarps = 4;
      store_rows_fp8_index_kernel<<<unsigned((n + kWarps - 1) / kWarps), 32 * kWarps, 0, cs()>>>(
          src, rows, n, kv_fp8_index_layout(int(width)), static_cast<uint8_t*>(pool));
      launched("store_rows_fp8_index");
      return;
    }
    if (dtype != KvDtype::kBf16) {
      record(cuda::errorf(ErrorCode::kUnsupported, "store_rows_kv: KV dtype {}",
                          kv_dtype_name(dtype)));
      return;
    }
    if (n <= 0 || width <= 0) return;
    store_rows_bf16_kernel<<<grid_for(n * width, 256), 256, 0, cs()>>>(
        src, rows, n, width, static_cast<uint16_t*>(pool));
    launched("store_rows_bf16");
  }
  void embed(const float* table, const int32_t* ids, int64_t S, int D, int n_streams,
             float* out) override {
    if (S <= 0) return;
    if (D % 4 == 0 && ((reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out)) &
                       15) == 0) {
      embed_kernel<float4><<<grid_for(S * n_streams * int64_t(D / 4), 256), 256, 0, cs()>>>(
          reinterpret_cast<const float4*>(table), ids, S, D / 4, n_streams,
          reinterpret_cast<float4*>(out));
      launched("embed_kernel<float4>");
      return;
    }
    embed_kernel<float><<<grid_for(S * n_streams * int64_t(D), 256), 256, 0, cs()>>>(
        table, ids, S, D, n_streams, out);
    launched("embed_kernel");
  }
  void rms_norm(const float* x, const float* weight, int64_t rows, int dim, float eps,
                float* y) override {
    record(cuda::rmsnorm<float>(x, weight, y, rows, dim, eps, cs()));
  }
  void rope(float* x, int64_t rows, int n_heads, int head_dim, int rope_dim,
            const int64_t* positions, const float* inv_freq, float attention_scaling,
            bool inverse) override {
    record(cuda::rope_interleaved<float>(x, positions, inv_freq, rows, n_heads, head_dim, rope_dim,
                                         int64_t(n_heads) * head_dim, inverse, cs(),
                                         attention_scaling));
  }
  void rms_norm_rope(float* x, const float* weight, int64_t rows, int n_heads, int head_dim,
                     float eps, int rope_dim, const int64_t* positions, const float* inv_freq,
                     float attention_scaling) override {
    record(cuda::rmsnorm_rope(x, weight, positions, inv_freq, rows, n_heads, head_dim, rope_dim,
                              eps, attention_scaling, cs()));
  }
  // mHC: one fused kernel per site (mhc.h mhc_fused: coefficients, collapse and the following
  // RMSNorm), so hc_pre / hc_pre_norm (and hc_head / hc_head_norm) give the same bits.
  void hc_pre(const HcArgs& a) override { hc_pre_norm(a, nullptr, 0.f, nullptr); }
  void hc_pre_norm(const HcArgs& a, const float* norm_weight, float norm_eps, float* x) override {
    cuda::MhcFusedArgs f;
    f.h = a.h;
    f.fn = a.fn;
    f.base = a.base;
    f.scale = a.scale;
    f.n = a.n_streams;
    f.sinkhorn_iters = a.sinkhorn_iters;
    f.rms_eps = a.rms_eps;
    f.hc_eps = a.hc_eps;
    f.collapsed = a.collapsed;
    f.post = a.post;
    f.comb = a.comb;
    f.norm_weight = norm_weight;
    f.norm_eps = norm_eps;
    f.x = x;
    f.S = a.n_rows;
    f.D = a.hidden;
    run_mhc_fused(f);
  }
  void hc_post(float* h, const float* f, const float* post, const float* comb, int64_t S, int n,
               int D) override {
    record(cuda::mhc_post_add(h, f, nullptr, post, comb, h, S, n, D, cs()));
  }
  void hc_post_add(float* h, float* f, const float* f_add, const float* post, const float* comb,
                   int64_t S, int n, int D) override {
    record(cuda::mhc_post_add(h, f, f_add, post, comb, h, S, n, D, cs()));
  }
  void hc_head(const float* h, const float* fn, const float* base, const float* scale, int64_t S,
               int n, int D, float rms_eps, float hc_eps, float* y) override {
    run_mhc_head(h, fn, base, scale, S, n, D, rms_eps, hc_eps, nullptr, 0.f, y, false);
  }
  void hc_head_norm(const float* h, const float* fn, const float* base, const float* scale,
                    int64_t S, int n, int D, float rms_eps, float hc_eps, const float* norm_weight,
                    float norm_eps, float* y) override {
    run_mhc_head(h, fn, base, scale, S, n, D, rms_eps, hc_eps, norm_weight, norm_eps, y, true);
  }
  void compress_pool(const CompressArgs& a) override {
    if (a.n_out <= 0) return;
    compress_pool_kernel<<<grid_for(a.n_out * a.dim, 256), 256, 0, cs()>>>(a);
    launched("compress_pool_kernel");
  }

  /// fp8 pools take FlashCompressor's fused fp8 store unless V4_COMPRESS_FP8_FUSED=0 (the
  /// unfused composition; A/B runs). Read at every call.
  static bool compress_fp8_fused() {
    const char* e = std::getenv("V4_COMPRESS_FP8_FUSED");
    return !(e && e[0] == '0');
  }
  /// The projection kernel (cuda::compress_proj: both projections + the ring refresh) and then
  /// the pooling kernel, in bf16 mode for decode-sized steps it supports of at least
  /// cuda::kCompressProjMinRows rows; otherwise the default composition. V4_COMPRESS_PROJ (A/B
  /// runs and tests; read at every call): 0 = the composition always, 1 = compress_proj for
  /// every step it supports, one-row steps included.
  void compress_project(const CompressProjectArgs& a) override {
    const char* e = std::getenv("V4_COMPRESS_PROJ");
    const bool off = e && e[0] == '0', forced = e && e[0] == '1';
    if (opts_.precision == Precision::kBf16 && !off &&
        (forced || a.n_fresh >= cuda::kCompressProjMinRows) &&
        cuda::compress_proj_supported(a, n_sms_)) {
      record(cuda::compress_proj(a, n_sms_, cs()));
      CompressFusedArgs s = a.step;
      s.fresh_kv = a.kc;
      s.fresh_gate = a.zc;
      s.n_ring = 0;  // refreshed by compress_proj (ring_disjoint: no window reads those rows)
      s.ring_src = s.ring_dst = nullptr;
      compress_fused(s);
      return;
    }
    Ops::compress_project(a);
  }
  void compress_fused(const CompressFusedArgs& a) override {
    // fp8 indexer keys (kFp8Index): FlashCompressor's fused store (one scale per row) when
    // V4_COMPRESS_FP8_FUSED is not 0 and the vector plan applies
    // (cuda::compress_fused_index_fp8_ok); otherwise the default composition (pool, norm, rope
    // into scratch, store_rows_fp8_index_kernel, ring refresh).
    const bool idx_composed = a.pool_dtype == KvDtype::kFp8Index &&
                              (!compress_fp8_fused() || !cuda::compress_fused_index_fp8_ok(a));
    if (idx_composed || (a.pool_dtype == KvDtype::kFp8 && !compress_fp8_fused())) {
      // fp8 compressed rows, V4_COMPRESS_FP8_FUSED=0: the default composition (pool, norm,
      // rope into scratch, then store_rows_kv's fp8 kernel, then the ring refresh). Default:
      // FlashCompressor quantizes in its final store (the same bytes as kvfp8::quantize_row
      // of its f32 row).
      if (a.n_out > 0 && !a.scratch) {
        record(cuda::errorf(ErrorCode::kInvalidArgument,
                            "compress_fused: fp8 pools need CompressFusedArgs::scratch"));
        return;
      }
      Ops::compress_fused(a);
      return;
    }
    record(cuda::compress_fused(a, cs()));
  }

  void indexer_topk(const IndexerArgs& a) override {
    const int64_t S = a.n_rows;
    const int k = a.topk;
    if (S <= 0) return;
    if (k > 1024) {
      record(cuda::errorf(ErrorCode::kUnsupported, "indexer_topk: topk {} > 1024", k));
      return;
    }
    if (int64_t(a.n_heads) * a.head_dim > 12000) {
      record(cuda::errorf(ErrorCode::kUnsupported, "indexer_topk: nI·dI = {} too large",
                          a.n_heads * a.head_dim));
      return;
    }
    // The grid needs the longest candidate list: the planner's bound when given (no sync, so a
    // CUDA graph can capture this), else read the counts back.
    int64_t maxc = std::max<int64_t>(1, a.max_count);
    if (a.max_count <= 0) {
      std::vector<int32_t> cnt(S);
      check(cudaMemcpyAsync(cnt.data(), a.cand.count, S * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, cs()),
            "indexer counts");
      check(cudaStreamSynchronize(cs()), "indexer counts sync");
      for (int32_t c : cnt) maxc = c > maxc ? c : maxc;
    }
    if (maxc > cuda::kTopkMaxRow) {
      record(cuda::errorf(ErrorCode::kUnsupported, "indexer_topk: {} candidates > {}", maxc,
                          cuda::kTopkMaxRow));
      return;
    }
    const int64_t ld = (maxc + 3) / 4 * 4;
    float* scores = static_cast<float*>(scratch(0, size_t(S * ld) * sizeof(float)));
    int32_t* sel = static_cast<int32_t*>(scratch(1, size_t(S * k) * sizeof(int32_t)));
    dim3 g1(unsigned((maxc + 127) / 128), unsigned(S));
    const size_t smem = size_t(a.n_heads * a.head_dim + a.n_heads) * sizeof(float);
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(indexer_score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem)),
            "indexer smem attribute");
    // The chain (docs/cuda.md §Indexer chain): with opts_.indexer_pdl each kernel that is
    // PDL-launched waits for its predecessor before any global access (so the first kernel after
    // a cross-stream wait — branch_wait on fork branch 3, or a join — is ordered after every
    // prerequisite), and triggers its dependents: the top-k and finalize at their start, the
    // scores kernels after their loop (their one-wave grid keeps its SMs).
    // Measured (H200, bench/results/cuda-indexer.md, chain table): PDL saves 1.5–3.6 µs a chain
    // at batch 1 but costs 2–9 µs at batch 64, so only calls of ≤ indexer_pdl_max_rows rows use it.
    const bool pdl = opts_.indexer_pdl && S <= opts_.indexer_pdl_max_rows &&
                     maxc <= opts_.indexer_pdl_max_count;
    if (!batch_invariant_ && cuda::indexer_tc_supported(a.n_heads, a.head_dim)) {
      // bf16 tensor cores (indexer.h): bf16 tolerance, so only when fp32 results are not needed.
      // A forced variant (CudaOptions::indexer_scores_variant) only where auto takes the decode
      // kernel; elsewhere auto.
      const int v = S <= cuda::kIndexerDecodeMaxRows && cuda::indexer_decode_supported(a)
                        ? opts_.indexer_scores_variant
                        : 0;
      record(cuda::indexer_scores_tc(a, maxc, scores, ld, n_sms_, cs(), v, pdl));
    } else {
      indexer_score_kernel<<<g1, 128, smem, cs()>>>(a, scores, ld);
      launched("indexer_score_kernel");
    }
    // The gate (CudaOptions::indexer_gate_min_count): the hinted branch's later ops follow the
    // scores kernel. Only a branch that has joined this fork (main always has).
    // Not with a PDL chain: the event record between the scores kernel and the top-k would stop
    // the top-k overlapping the scores kernel's tail (the overlap PDL is there for).
    if (fork_active_ && !pdl && a.after_scores_branch >= 0 && a.after_scores_branch < n_branches_ &&
        opts_.indexer_gate_min_count > 0 && maxc >= opts_.indexer_gate_min_count) {
      const int dst = a.after_scores_branch % kStreams;
      if (dst != cur_ && (dst == 0 || side_waited_[dst - 1])) {
        check(cudaEventRecord(ev_gate_, cs()), "indexer gate event");
        check(cudaStreamWaitEvent(stream_of(dst), ev_gate_, 0), "indexer gate");
      }
    }
    // Step profile: the top-k and the finalize get the caller's region (the region before this
    // call then holds the scores kernel alone). A marker is an event record between the
    // kernels, so under --profile the top-k does not overlap the scores kernel's tail (PDL).
    if (a.topk_region) region(a.topk_region);
    // Batch-1 rows of 8K–256K candidates: the top-k writes the pool rows itself (the finalize
    // fused, one launch less on the chain); elsewhere kUnsupported, nothing launched.
    // (A plan with no candidate rows at all may pass a null map: the finalize never reads it.)
    if (a.cand.rows && a.cand.offset && a.out_rows) {
      const Status fused = cuda::topk_rows_mapped(scores, ld, a.cand.count, S, k, maxc, a.cand.rows,
                                                  a.cand.offset, a.out_rows, a.out_count, cs(), pdl);
      if (fused.code() != ErrorCode::kUnsupported) {
        record(fused);
        return;
      }
    }
    record(cuda::topk_rows(scores, ld, a.cand.count, S, k, maxc, sel, nullptr, cs(), 0, pdl));
    if (!pdl) {
      indexer_finalize_kernel<false><<<unsigned(S), 128, 0, cs()>>>(sel, a.cand, k, a.out_rows,
                                                                     a.out_count);
      launched("indexer_finalize_kernel");
      return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(S), 1, 1);
    cfg.blockDim = dim3(128, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = cs();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const RowMap cand = a.cand;
    int32_t* const out_rows = a.out_rows;
    int32_t* const out_count = a.out_count;
    const int32_t* const sl = sel;
    check(cudaLaunchKernelEx(&cfg, indexer_finalize_kernel<true>, sl, cand, k, out_rows, out_count),
          "indexer_finalize_kernel (PDL)");
    launched("indexer_finalize_kernel (PDL)");
  }

  void sparse_attention(const AttentionArgs& a) override {
    if (a.n_rows <= 0) return;
    if (a.head_dim > kAttnMaxHd) {
      record(cuda::errorf(ErrorCode::kUnsupported, "sparse_attention: head_dim {} > {}", a.head_dim,
                          kAttnMaxHd));
      return;
    }
    // bf16 / fp8 KV pools take attention_dec at every row count: attention_mma (TF32) stages f32
    // rows only, and with the split kernel a 4,096-token prefill step took 899 ms instead of 577
    // (bf16). fp8 rows need rope_dim 64 there (KeyPool<KvFp8Row>); others take the split kernel.
    const bool dec_rows =
        a.n_rows <= opts_.attention_dec_max_rows || a.kv_dtype != KvDtype::kF32;
    if (!batch_invariant_ && opts_.attention_dec && dec_rows &&
        cuda::attention_dec_supported(a.n_heads, a.head_dim) &&
        (a.kv_dtype != KvDtype::kFp8 || a.rope_dim == 64)) {
      // bf16 tensor-core decode kernel (attention_dec.h): bf16 mode only.
      const int variant =
          opts_.attention_dec_variant >= 1 && opts_.attention_dec_variant <= 14
              ? opts_.attention_dec_variant
              : cuda::attention_dec_auto_variant(a.n_rows, a.max_keys, opts_.attention_dec_lean);
      // Variants 3 / 4 (32 / 16 heads per block) and 5 (16 heads, cluster merge of ≤ 16
      // splits); fp8 pools run variant 2 inside: own splits.
      const bool v3 = variant >= 3 && a.kv_dtype != KvDtype::kFp8;
      const bool v7 = variant >= 7 && a.kv_dtype == KvDtype::kBf16;  // else variant 2 inside
      const int splits =
          v7 ? cuda::attention_dec7_splits(a.n_rows, a.n_heads, a.max_keys, n_sms_,
                                           cuda::attention_dec7_tile_keys(variant),
                                           cuda::attention_dec11_max_cluster(variant))
          : v3 && variant >= 7 ? cuda::attention_dec_splits(a.n_rows, a.n_heads, a.max_keys,
                                                            n_sms_, 4)
          : v3 && (variant == 5 || variant == 6)
              ? cuda::attention_dec5_splits(a.n_rows, a.n_heads, a.max_keys, n_sms_,
                                            cuda::attention_dec5_max_cluster(a.kv_dtype, variant),
                                            variant)
          : v3 ? cuda::attention_dec3_splits(a.n_rows, a.n_heads, a.max_keys, n_sms_,
                                             variant == 3 ? 32 : 16)
               : cuda::attention_dec_splits(a.n_rows, a.n_heads, a.max_keys, n_sms_,
                                            a.kv_dtype == KvDtype::kBf16 ? 2 : 4);
      float* ws = nullptr;
      if (splits > 1)
        ws = static_cast<float*>(scratch(
            cuda::kSlotAttention,
            size_t(cuda::attention_workspace_floats(a.n_rows, a.n_heads, a.head_dim, splits)) *
                sizeof(float)));
      record(cuda::sparse_attention_dec(a, splits, ws, cs(), variant));
      return;
    }
    if (!batch_invariant_ && a.kv_dtype == KvDtype::kF32 &&
        cuda::attention_mma_supported(a.n_heads, a.head_dim)) {
      // TF32 tensor cores (attention.h): outside the fp32 reference mode only.
      const int splits = a.max_keys <= 0 ? 1
                                         : cuda::attention_auto_splits(a.n_rows, a.n_heads,
                                                                       a.max_keys, n_sms_, 64);
      float* ws = nullptr;
      if (splits > 1)
        ws = static_cast<float*>(scratch(
            cuda::kSlotAttention,
            size_t(cuda::attention_workspace_floats(a.n_rows, a.n_heads, a.head_dim, splits)) *
                sizeof(float)));
      record(cuda::sparse_attention_mma(a, splits, ws, cs()));
      return;
    }
    if (a.head_dim <= cuda::kAttnSplitMaxHd) {
      // Split-KV kernel (attention.h). The split count changes a row's summation order, so it
      // depends on the batch only when batch invariance is not required. Also bf16 KV pools
      // outside decode (attention_mma stages f32 rows with cp.async: f32 pools only).
      const int splits = batch_invariant_ || a.max_keys <= 0
                             ? 1
                             : cuda::attention_auto_splits(a.n_rows, a.n_heads, a.max_keys, n_sms_);
      float* ws = nullptr;
      if (splits > 1)
        ws = static_cast<float*>(scratch(
            cuda::kSlotAttention,
            size_t(cuda::attention_workspace_floats(a.n_rows, a.n_heads, a.head_dim, splits)) *
                sizeof(float)));
      record(cuda::sparse_attention_split(a, splits, ws, cs()));
      return;
    }
    const int64_t warps = a.n_rows * a.n_heads;
    attention_kernel<<<grid_for(warps * 32, 128, int64_t(1) << 31), 128, 0, cs()>>>(a);
    launched("attention_kernel");
  }

  // ---- step timing (ops.h StepTiming): CUDA events around each model step ----------------
  void step_begin(bool decode_only) override {
    if (capturing_) return;
    if (!ev_begin_) {
      for (cudaEvent_t* e : {&ev_begin_, &ev_end_[0], &ev_end_[1]})
        check(cudaEventCreate(e), "cudaEventCreate");
    }
    check(cudaEventRecord(ev_begin_, stream_), "step_begin");
    host_gap_s_ = have_prev_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             host_end_)
                                   .count()
                             : 0.0;
    in_step_ = true;
    cur_decode_ = decode_only;
  }
  void note_host_prep(double seconds) override { host_prep_s_ = seconds; }
  void step_end() override {
    if (forked_) {
      record(Status(ErrorCode::kInternal, "step_end between fork and join"));
      join();
    }
    if (capturing_ || !in_step_) return;
    in_step_ = false;
    cudaEvent_t end = ev_end_[cur_end_ ^ 1];
    check(cudaEventRecord(end, stream_), "step_end");
    check(cudaEventSynchronize(end), "step_end sync");
    host_end_ = std::chrono::steady_clock::now();
    float busy_ms = 0, idle_ms = 0;
    check(cudaEventElapsedTime(&busy_ms, ev_begin_, end), "step busy");
    if (have_prev_) check(cudaEventElapsedTime(&idle_ms, ev_end_[cur_end_], ev_begin_), "step idle");
    {
      std::lock_guard<std::mutex> lk(timing_mu_);
      timing_.steps += 1;
      timing_.busy_s += busy_ms * 1e-3;
      timing_.idle_s += idle_ms * 1e-3;
      if (cur_decode_ && prev_decode_ && have_prev_) {
        timing_.decode_steps += 1;
        timing_.decode_busy_s += busy_ms * 1e-3;
        timing_.decode_idle_s += idle_ms * 1e-3;
        timing_.decode_host_prep_s += host_prep_s_;
        timing_.decode_host_gap_s += host_gap_s_;
      }
    }
    host_prep_s_ = 0;
    cur_end_ ^= 1;
    have_prev_ = true;
    prev_decode_ = cur_decode_;
    if (profiling_) accumulate_regions(end);
    step_marks_.clear();
    eager_used_ = 0;
  }
  StepTiming step_timing() const override {
    std::lock_guard<std::mutex> lk(timing_mu_);
    return timing_;
  }

  // ---- per-region step profile (ops.h region / set_profiling) -------------------------------
  struct Mark {
    const char* name;
    cudaEvent_t ev;
  };
  void region(const char* name) override {
    if (!profiling_) return;
    cudaEvent_t ev = nullptr;
    if (capturing_) {  // an event-record node of the graph, timed on every replay
      check(cudaEventCreate(&ev), "region event");
      check(cudaEventRecordWithFlags(ev, stream_, cudaEventRecordExternal), "region record");
      capture_marks_.push_back({name, ev});
      return;
    }
    if (!in_step_) return;
    if (eager_used_ == eager_events_.size()) {
      check(cudaEventCreate(&ev), "region event");
      eager_events_.push_back(ev);
    }
    ev = eager_events_[eager_used_++];
    check(cudaEventRecord(ev, stream_), "region record");
    step_marks_.push_back({name, ev});
  }
  bool set_profiling(bool on) override {
    profiling_ = on;
    return true;
  }
  std::vector<RegionTime> region_profile() const override {
    std::lock_guard<std::mutex> lk(timing_mu_);
    std::vector<RegionTime> out;
    for (const auto& [name, t] : profile_) out.push_back(t);
    return out;
  }
  void reset_region_profile() override {
    std::lock_guard<std::mutex> lk(timing_mu_);
    profile_.clear();
  }
  void profiler_range(bool on) override {
    cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop();
    if (e != cudaSuccess)
      V4_LOG_WARN("cudaProfiler{}: {}", on ? "Start" : "Stop", cudaGetErrorString(e));
  }

  // ---- multi-stream branches (ops.h fork / branch / join; docs/cuda.md §Multi-stream) -------
  // fork: an event on the main stream; a side stream waits on it the first time its branch is
  // selected (under capture that wait pulls the side stream into the capture). join: an event on
  // every side stream that joined, main waits on each. Branches past the side streams share them
  // modulo kStreams (same stream = issue order, still valid). Inactive (multi_stream off, or the
  // region profile on, whose markers live on the main stream): every branch is the main stream.
  void fork(int branches, int64_t rows = 0) override {
    if (forked_) {
      record(Status(ErrorCode::kInternal, "fork while forked (no nesting)"));
      return;
    }
    forked_ = true;
    n_branches_ = std::max(1, branches);
    cur_ = 0;
    for (bool& w : side_waited_) w = false;
    for (bool& u : scratch_fork_used_) u = false;
    fork_active_ = opts_.multi_stream && !profiling_ && n_branches_ > 1 && side_[0] != nullptr &&
                   (opts_.multi_stream_max_rows <= 0 || rows <= opts_.multi_stream_max_rows);
    if (fork_active_) {
      check(cudaEventRecord(ev_fork_, stream_), "fork event");
      ++forks_;
    }
  }
  void branch(int b) override {
    if (!forked_ || b < 0 || b >= n_branches_) {
      record(cuda::errorf(ErrorCode::kInternal, "branch({}) outside a fork of {} branches", b,
                          forked_ ? n_branches_ : 0));
      return;
    }
    if (!fork_active_) return;
    cur_ = b % kStreams;
    if (cur_ > 0 && !side_waited_[cur_ - 1]) {
      check(cudaStreamWaitEvent(side_[cur_ - 1], ev_fork_, 0), "fork wait");
      side_waited_[cur_ - 1] = true;
    }
  }
  void branch_wait(int b) override {
    if (!forked_ || b < 0 || b >= n_branches_) {
      record(cuda::errorf(ErrorCode::kInternal, "branch_wait({}) outside a fork of {} branches", b,
                          forked_ ? n_branches_ : 0));
      return;
    }
    if (!fork_active_) return;
    const int src = b % kStreams;
    // Same stream: already ordered. A side stream that has not joined this fork holds no work
    // issued in it (earlier work is ordered by the fork event every branch waited on).
    if (src == cur_ || (src > 0 && !side_waited_[src - 1])) return;
    check(cudaEventRecord(ev_xbranch_[src], stream_of(src)), "branch_wait event");
    check(cudaStreamWaitEvent(cs(), ev_xbranch_[src], 0), "branch_wait");
  }
  void join() override {
    if (!forked_) {
      record(Status(ErrorCode::kInternal, "join without fork"));
      return;
    }
    if (fork_active_) {
      for (int i = 0; i < kStreams - 1; ++i) {
        if (!side_waited_[i]) continue;
        check(cudaEventRecord(ev_join_[i], side_[i]), "join event");
        check(cudaStreamWaitEvent(stream_, ev_join_[i], 0), "join wait");
        side_waited_[i] = false;
      }
    }
    // Main now follows every branch: scratch slots are main's again.
    for (int& o : scratch_owner_) o = 0;
    forked_ = false;
    fork_active_ = false;
    cur_ = 0;
  }
  bool set_multi_stream(bool on) override {
    if (capturing_ || forked_) return false;
    if (on) {
      const Status st = make_side_streams();
      if (!st.ok()) {
        record(st);
        return false;
      }
    }
    opts_.multi_stream = on;
    return true;
  }
  /// Forks that ran concurrently / scratch handoffs between streams since creation (tests).
  int64_t forks() const { return forks_; }
  int64_t scratch_handoffs() const { return handoffs_; }

  void route(const RouteArgs& a) override {
    if (a.n_rows <= 0) return;
    if (a.topk > kRouteMaxK) {
      record(cuda::errorf(ErrorCode::kUnsupported, "route: topk {} > {}", a.topk, kRouteMaxK));
      return;
    }
    route_kernel<<<unsigned(a.n_rows), kRouteThreads, size_t(a.n_experts) * sizeof(float),
                   cs()>>>(a);
    launched("route_kernel");
  }

  void moe_experts(const MoeArgs& a) override {
    if (a.n_rows <= 0) return;
    record(opts_.precision == Precision::kBf16 ? cuda::moe_bf16(a, context())
                                                : cuda::moe_fp32(a, context()));
  }

  /// Grows the scratch buffers to what calls within `b` need (reserve_cuda_scratch).
  Status reserve(const CudaScratchBounds& b) {
    size_t need[cuda::kNumScratchSlots] = {};
    const cuda::KernelContext c = context();
    const bool bf16 = opts_.precision == Precision::kBf16;
    if (bf16 && b.max_rows > 0 && b.max_n > 0 && b.max_k > 0) {
      cuda::linear_scratch_bytes(b.max_rows, b.max_n, b.max_k, false, c, need);
      cuda::linear_scratch_bytes(b.max_rows, b.max_n, b.max_k, true, c, need);
    }
    if (b.max_rows > 0 && b.hidden > 0 && b.inter > 0 && b.experts > 0 && b.topk > 0) {
      cuda::moe_scratch_bytes(bf16, b.max_rows, b.hidden, b.inter, b.experts, b.topk, c, need);
      cuda::moe_scratch_bytes(bf16, b.max_rows, b.hidden, b.inter, 1, 1, c, need);  // shared
    }
    if (b.max_rows > 0)
      need[cuda::kSlotMhc] = size_t(cuda::mhc_fused_work_floats(b.max_rows)) * sizeof(float);
    try {
      for (int s = 0; s < cuda::kNumScratchSlots; ++s)
        if (need[s] && s != cuda::kSlotMhcCount) scratch(s, need[s]);
      if (b.max_rows > 0) mhc_counters(b.max_rows);
    } catch (const std::bad_alloc&) {
      return Status(ErrorCode::kResourceExhausted, "reserve_cuda_scratch: out of device memory");
    }
    return Status::Ok();
  }

  // Device sampling (ops/cuda/sampling.h): only token ids and logprobs leave the GPU.
  bool sample(const SampleArgs& a) override {
    if (a.n_rows > 0) record(sampler_.run(a, cs()));
    return true;
  }

  // ---- dummy weights, memory and device queries (ops.h; kernels in fill.cu) -------------
  void fill_random(void* dst, int64_t n, RandomFill kind, float scale, uint64_t seed) override {
    record(cuda::fill_random(dst, n, fill::make_params(kind, scale, seed), cs()));
  }
  MemoryInfo memory_info() override {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return {int64_t(free_b), int64_t(total_b)};
  }
  std::string device_info() override { return cuda::device_info(); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs()), "copy");
  }
  // One H2D copy of the piece list (from a pinned staging buffer, so it is asynchronous; the
  // staging buffer is rewritten only after the previous list's upload finished) + one kernel.
  void copy_batch(const CopySegment* segs, int64_t n) override {
    if (n <= 0) return;
    if (capturing_) return record(Status(ErrorCode::kInternal, "copy_batch during graph capture"));
    if (forked_) return record(Status(ErrorCode::kInternal, "copy_batch between fork and join"));
    int64_t pieces = 0;
    for (int64_t i = 0; i < n; ++i) pieces += int64_t((segs[i].bytes + kCopyPiece - 1) / kCopyPiece);
    if (pieces == 0) return;
    if (pieces == 1) {  // one piece: a plain async copy, no list upload
      for (int64_t i = 0; i < n; ++i) copy(segs[i].dst, segs[i].src, segs[i].bytes);
      return;
    }
    if (!ev_copy_) check(cudaEventCreateWithFlags(&ev_copy_, cudaEventDisableTiming), "copy event");
    check(cudaEventSynchronize(ev_copy_), "copy_batch staging wait");  // previous list uploaded
    if (copy_host_cap_ < pieces) {
      if (copy_host_) cudaFreeHost(copy_host_);
      copy_host_ = nullptr;
      const int64_t cap = std::max<int64_t>(pieces, 2 * copy_host_cap_);
      if (cudaMallocHost(reinterpret_cast<void**>(&copy_host_), size_t(cap) * sizeof(CopySegment)) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        copy_host_cap_ = 0;
        throw std::bad_alloc();
      }
      copy_host_cap_ = cap;
    }
    if (copy_dev_cap_ < pieces) {
      if (copy_dev_) {
        check(cudaStreamSynchronize(stream_), "copy_batch list sync");  // a kernel may read it
        cudaFree(copy_dev_);
      }
      copy_dev_ = nullptr;
      const int64_t cap = std::max<int64_t>(pieces, 2 * copy_dev_cap_);
      if (cudaMalloc(reinterpret_cast<void**>(&copy_dev_), size_t(cap) * sizeof(CopySegment)) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        copy_dev_cap_ = 0;
        throw std::bad_alloc();
      }
      copy_dev_cap_ = cap;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i)
      for (size_t off = 0; off < segs[i].bytes; off += kCopyPiece) {
        CopySegment& p = copy_host_[k++];
        p.dst = static_cast<char*>(segs[i].dst) + off;
        p.src = static_cast<const char*>(segs[i].src) + off;
        p.bytes = std::min(kCopyPiece, segs[i].bytes - off);
      }
    check(cudaMemcpyAsync(copy_dev_, copy_host_, size_t(pieces) * sizeof(CopySegment),
                          cudaMemcpyHostToDevice, stream_),
          "copy_batch list upload");
    check(cudaEventRecord(ev_copy_, stream_), "copy_batch event");
    const int64_t blocks = std::min<int64_t>(pieces, int64_t(n_sms_) * 16);
    copy_batch_kernel<<<unsigned(blocks), 256, 0, stream_>>>(copy_dev_, pieces);
    launched("copy_batch_kernel");
  }

  // ---- decode plans and graphs (docs/cuda.md §Graphs) --------------------------------------
  void build_decode_plan(const DecodePlanArgs& a) override {
    record(cuda::build_decode_plan(a, cs()));
  }
  bool supports_graphs() const override { return true; }
  std::unique_ptr<Graph> capture(const std::function<void()>& body) override;
  /// Graph launch on the backend stream (CudaGraph::replay).
  void launch_graph(cudaGraphExec_t exec, const std::vector<Mark>& marks) {
    if (capturing_) return record(Status(ErrorCode::kInternal, "graph replay during capture"));
    check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    if (profiling_ && in_step_) step_marks_.insert(step_marks_.end(), marks.begin(), marks.end());
  }
  /// The region markers recorded by the capture that just ended (owned by its graph from now).
  std::vector<Mark> take_capture_marks() { return std::move(capture_marks_); }
  void drop_capture_marks() {
    for (const Mark& m : capture_marks_) cudaEventDestroy(m.ev);
    capture_marks_.clear();
  }
  /// A graph was destroyed; scratch buffers retired while graphs lived are freed with the last.
  void graph_released() {
    if (--live_graphs_ > 0 || retired_.empty()) return;
    check(cudaStreamSynchronize(stream_), "retired scratch sync");
    for (void* p : retired_) cudaFree(p);
    retired_.clear();
  }

 private:
  float* mhc_work(int64_t S) {
    return static_cast<float*>(
        scratch(cuda::kSlotMhc, size_t(cuda::mhc_fused_work_floats(S)) * sizeof(float)));
  }
  // mhc_fused's counters: a scratch slot zeroed whenever it is (re)allocated; the kernel leaves
  // them zero after every call.
  int* mhc_counters(int64_t S) {
    const size_t before = scratch_size_[cuda::kSlotMhcCount];
    void* p = scratch(cuda::kSlotMhcCount, size_t(cuda::mhc_fused_counters(S)) * sizeof(int));
    if (scratch_size_[cuda::kSlotMhcCount] != before)
      check(cudaMemsetAsync(p, 0, scratch_size_[cuda::kSlotMhcCount], cs()), "mhc counters");
    return static_cast<int*>(p);
  }
  void run_mhc_fused(const cuda::MhcFusedArgs& f) {
    if (f.S <= 0) return;
    record(cuda::mhc_fused(f, mhc_work(f.S), mhc_counters(f.S), cs()));
  }
  void run_mhc_head(const float* h, const float* fn, const float* base, const float* scale,
                    int64_t S, int n, int D, float rms_eps, float hc_eps, const float* norm_weight,
                    float norm_eps, float* y, bool norm) {
    cuda::MhcFusedArgs f;
    f.h = h;
    f.fn = fn;
    f.base = base;
    f.scale = scale;
    f.n = n;
    f.rms_eps = rms_eps;
    f.hc_eps = hc_eps;
    f.head = true;
    f.collapsed = norm ? nullptr : y;
    f.norm_weight = norm_weight;
    f.norm_eps = norm_eps;
    f.x = norm ? y : nullptr;
    f.S = S;
    f.D = D;
    run_mhc_fused(f);
  }
  // Adds this step's region times (markers in stream order, the last one ending at `end`).
  void accumulate_regions(cudaEvent_t end) {
    if (step_marks_.empty()) return;
    std::lock_guard<std::mutex> lk(timing_mu_);
    auto add = [&](const char* name, cudaEvent_t a, cudaEvent_t b) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      RegionTime& t = profile_[name];
      t.name = name;
      t.calls += 1;
      t.ms += ms;
    };
    add("(before first region)", ev_begin_, step_marks_.front().ev);
    for (size_t i = 0; i < step_marks_.size(); ++i)
      add(step_marks_[i].name, step_marks_[i].ev,
          i + 1 < step_marks_.size() ? step_marks_[i + 1].ev : end);
  }
  // A grown scratch buffer: freed, or kept while graphs live (a captured kernel may point at it).
  void retire_scratch(void* p) {
    scratch_.erase(p);
    if (live_graphs_ > 0) {
      retired_.push_back(p);
    } else {
      cudaFree(p);
    }
  }
  static constexpr size_t kSmallMax = size_t(64) << 20;
  static size_t size_class(size_t b) {
    size_t c = 256;
    while (c < b) c <<= 1;
    return c;
  }
  // V4_MOE_GROUPED_MIN_ROWS=N (N ≥ 1): MoE calls below moe_sync_min_pairs with S ≥ N rows also
  // take the grouped tensor-core path (decode A/B runs, CudaOptions::moe_grouped_mma); unset: 0.
  static int64_t grouped_min_rows_env() {
    static const int64_t v = [] {
      const char* e = std::getenv("V4_MOE_GROUPED_MIN_ROWS");
      return e && std::atoll(e) > 0 ? int64_t(std::atoll(e)) : int64_t(0);
    }();
    return v;
  }
  static int moe_mma_version_env() {
    static const int v = [] {
      const char* e = std::getenv("V4_MOE_MMA_VERSION");
      const int v = e ? std::atoi(e) : 2;
      return v == 1 || v == 3 ? v : 2;
    }();
    return v;
  }
  static int gmoe_warps_env() {
    static const int v = [] {
      const char* e = std::getenv("V4_GMOE_WARPS");
      return e && std::atoi(e) == 4 ? 4 : 8;
    }();
    return v;
  }
  static bool gmoe_wgmma_env() {
    static const bool v = [] {
      const char* e = std::getenv("V4_GMOE_WGMMA");
      return !(e && std::string(e) == "0");
    }();
    return v;
  }
  static int gmoe_wg_variant_env() {
    static const int v = [] {
      const char* e = std::getenv("V4_GMOE_WG_VARIANT");
      const int x = e ? std::atoi(e) : 0;
      return x >= 0 && x <= 4 ? x : 0;
    }();
    return v;
  }
  cuda::KernelContext context() {
    cuda::KernelContext c;
    c.stream = cs();
    c.gemm = gemm_.get();
    c.num_sms = n_sms_;
    c.gemv_max_rows = opts_.gemv_max_rows;
    c.sync_min_pairs = opts_.moe_sync_min_pairs;
    c.fused_tc = opts_.fused_tensor_cores;
    c.fused_moe_min_rows = opts_.moe_fused_min_rows;
    c.moe_mma = opts_.moe_mma;
    c.dense_mma = opts_.dense_mma;
    c.gemv_stream = opts_.gemv_stream;
    c.grouped_moe = opts_.moe_grouped_mma;
    c.grouped_min_rows = grouped_min_rows_env();
    c.moe_mma_version = moe_mma_version_env();
    c.gmoe_warps = gmoe_warps_env();
    c.gmoe_wgmma = gmoe_wgmma_env();
    c.gmoe_wg_variant = gmoe_wg_variant_env();
    c.scratch = [](void* self, int slot, size_t bytes) {
      return static_cast<CudaOps*>(self)->scratch(slot, bytes);
    };
    c.self = this;
    return c;
  }
  // Grow-only scratch buffer `slot` of at least `bytes` (device memory, stream-ordered reuse).
  // Growing needs cudaMalloc and a sync, which a stream capture cannot contain: during a capture
  // the error is recorded, which makes capture() discard the graph (nothing captured runs; the
  // caller runs eagerly, which grows the buffer, and captures again later).
  // Between fork and join the slots are shared by the streams: a stream taking a slot that
  // another stream used last first waits for that stream's work so far (an event recorded on it
  // now, after its last user was issued), so concurrent branches never share a slot; the
  // cuBLASLt workspace is covered by kSlotXBf16 (every cuBLASLt call follows a kSlotXBf16
  // request in the same op). At the model's decode sizes the branches take no slot (docs/cuda.md
  // §Multi-stream), so this never serializes them there.
  void* scratch(int slot, size_t bytes) {
    // A slot main owns but has not used since the fork is free for any branch: every side
    // stream waited on the fork event, recorded after main's earlier users (and, after a join,
    // after every branch's). No event, no handoff count.
    if (forked_ && scratch_owner_[slot] == 0 && !scratch_fork_used_[slot])
      scratch_owner_[slot] = cur_;
    if (forked_) scratch_fork_used_[slot] = true;
    if (forked_ && scratch_owner_[slot] != cur_) {
      const int prev = scratch_owner_[slot];
      check(cudaEventRecord(ev_handoff_[prev], stream_of(prev)), "scratch handoff event");
      check(cudaStreamWaitEvent(cs(), ev_handoff_[prev], 0), "scratch handoff wait");
      scratch_owner_[slot] = cur_;
      if (handoffs_++ == 0)
        V4_LOG_INFO("CUDA multi-stream: scratch slot {} handed from stream {} to {} (serializes "
                    "those branches; logged once)", slot, prev, cur_);
    }
    if (scratch_size_[slot] < bytes) {
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      if (capturing_ ||
          (cudaStreamIsCapturing(cs(), &cap) == cudaSuccess && cap != cudaStreamCaptureStatusNone)) {
        record(cuda::errorf(
            ErrorCode::kInternal,
            "scratch slot {} must grow from {} to {} bytes during CUDA graph capture (run the "
            "same shapes eagerly first, or reserve_cuda_scratch)",
            slot, scratch_size_[slot], bytes));
        return scratch_ptr_[slot];
      }
      if (scratch_ptr_[slot]) {
        check(cudaStreamSynchronize(stream_), "scratch sync");
        for (cudaStream_t st : side_)  // a branch may have used the old buffer
          if (st) check(cudaStreamSynchronize(st), "scratch sync (side stream)");
        retire_scratch(scratch_ptr_[slot]);
      }
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::bad_alloc();
      }
      scratch_ptr_[slot] = p;
      scratch_size_[slot] = bytes;
      scratch_[p] = bytes;
    }
    return scratch_ptr_[slot];
  }
  void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) record(cuda::cuda_status(e, what));
  }
  void launched(const char* kernel) { record(cuda::check_launch(kernel)); }
  void record(const Status& s) {
    if (s.ok() || !status_.ok()) return;
    status_ = s;
    V4_LOG_ERROR("CUDA backend: {}", s.to_string());
  }

  cudaStream_t stream_ = nullptr;
  // Multi-stream branches: the stream ops are issued on (branch `cur_`: 0 = stream_, b > 0 =
  // side_[b − 1]); every op method launches on cs().
  static constexpr int kStreams = 4;
  static constexpr int kIndexerBranch = 3;  // fork branch of the indexer chain (model attention)
  cudaStream_t stream_of(int i) const { return i == 0 ? stream_ : side_[i - 1]; }
  cudaStream_t cs() const { return stream_of(cur_); }
  cudaStream_t side_[kStreams - 1] = {};
  cudaEvent_t ev_fork_ = nullptr, ev_join_[kStreams - 1] = {}, ev_handoff_[kStreams] = {},
              ev_xbranch_[kStreams] = {}, ev_gate_ = nullptr;
  bool side_waited_[kStreams - 1] = {};
  bool forked_ = false, fork_active_ = false;
  int n_branches_ = 1, cur_ = 0;
  int scratch_owner_[cuda::kNumScratchSlots] = {};
  bool scratch_fork_used_[cuda::kNumScratchSlots] = {};  // taken by any stream since the fork
  int64_t forks_ = 0, handoffs_ = 0;
  int n_sms_ = 132;
  // Step timing (step_begin / step_end).
  cudaEvent_t ev_begin_ = nullptr, ev_end_[2] = {nullptr, nullptr};
  // copy_batch: pinned staging and device copy of the piece list (grow-only), and the event
  // marking the end of the last list upload (the staging buffer is free again after it).
  CopySegment* copy_host_ = nullptr;
  CopySegment* copy_dev_ = nullptr;
  int64_t copy_host_cap_ = 0, copy_dev_cap_ = 0;
  cudaEvent_t ev_copy_ = nullptr;
  int cur_end_ = 0;
  bool in_step_ = false, have_prev_ = false, cur_decode_ = false, prev_decode_ = false;
  mutable std::mutex timing_mu_;
  StepTiming timing_;
  double host_prep_s_ = 0;  // note_host_prep of the step in flight
  // Host clock at the last step_end's sync and the gap from it to the step in flight's begin.
  std::chrono::steady_clock::time_point host_end_{};
  double host_gap_s_ = 0;
  // Region profile: this step's markers (eager events are reused step to step; graph markers
  // belong to their graph), the markers of the capture in progress, totals per name.
  bool profiling_ = false;
  std::vector<Mark> step_marks_, capture_marks_;
  std::vector<cudaEvent_t> eager_events_;
  size_t eager_used_ = 0;
  std::map<std::string, RegionTime> profile_;
  // Results of a row may not depend on the other rows of the call (fp32 reference mode).
  bool batch_invariant_ = true;
  Status status_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  std::map<void*, size_t> live_;
  std::map<void*, size_t> scratch_;
  void* scratch_ptr_[cuda::kNumScratchSlots] = {};
  size_t scratch_size_[cuda::kNumScratchSlots] = {};
  CudaOptions opts_;
  std::unique_ptr<cuda::Gemm> gemm_;
  bool capturing_ = false;
  int live_graphs_ = 0;
  std::vector<void*> retired_;  // grown-out scratch kept for live graphs
  cuda::DeviceSampler sampler_;  // grow-only scratch of `sample`
};

// A captured graph of CudaOps work, replayed on its stream.
class CudaGraph final : public Graph {
 public:
  CudaGraph(CudaOps* ops, cudaGraphExec_t exec, std::vector<CudaOps::Mark> marks)
      : ops_(ops), exec_(exec), marks_(std::move(marks)) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    for (const CudaOps::Mark& m : marks_) cudaEventDestroy(m.ev);
    ops_->graph_released();
  }
  void replay() override { ops_->launch_graph(exec_, marks_); }

 private:
  CudaOps* ops_;
  cudaGraphExec_t exec_;
  std::vector<CudaOps::Mark> marks_;  // region markers inside the graph (profiling)
};

// Stream capture (relaxed mode: a stray unsafe call elsewhere in the process does not break it;
// our own alloc/free/upload/download/synchronize refuse to run while capturing). Errors recorded
// during the capture belong to it (nothing ran) and are cleared after logging.
std::unique_ptr<Graph> CudaOps::capture(const std::function<void()>& body) {
  if (!status_.ok()) return nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    V4_LOG_WARN("CUDA graph capture: begin: {}", cudaGetErrorString(e));
    (void)cudaGetLastError();
    return nullptr;
  }
  capturing_ = true;
  drop_capture_marks();
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    if (forked_) join();  // side streams must rejoin before the capture ends
    capturing_ = false;
    drop_capture_marks();
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    (void)(status_ = Status::Ok());
    throw;
  }
  if (forked_) {
    record(Status(ErrorCode::kInternal, "capture body ended between fork and join"));
    join();
  }
  capturing_ = false;
  e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess || !status_.ok()) {
    V4_LOG_WARN("CUDA graph capture failed: {}",
                e != cudaSuccess ? std::string(cudaGetErrorString(e)) : status_.to_string());
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    (void)(status_ = Status::Ok());
    drop_capture_marks();
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    V4_LOG_WARN("CUDA graph instantiate failed: {}", cudaGetErrorString(e));
    (void)cudaGetLastError();
    drop_capture_marks();
    return nullptr;
  }
  ++live_graphs_;
  return std::make_unique<CudaGraph>(this, exec, take_capture_marks());
}

}  // namespace

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

Result<std::unique_ptr<Ops>> make_cuda_ops(CudaOptions options) {
  auto ops = std::make_unique<CudaOps>(options);
  V4_RETURN_IF_ERROR(ops->init());
  return Result<std::unique_ptr<Ops>>(std::unique_ptr<Ops>(std::move(ops)));
}

CudaStreamStats cuda_stream_stats(const Ops* ops) {
  const auto* c = dynamic_cast<const CudaOps*>(ops);
  if (!c) return {};
  return {c->forks(), c->scratch_handoffs()};
}

Status reserve_cuda_scratch(Ops* ops, const CudaScratchBounds& b) {
  auto* c = dynamic_cast<CudaOps*>(ops);
  if (!c) return Status(ErrorCode::kInvalidArgument, "reserve_cuda_scratch: not a CUDA backend");
  return c->reserve(b);
}

}  // namespace v4::ops
