#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/mhc.h"

#include <cstdlib>
#include <string>

namespace v4::cuda {
namespace {

constexpr int kMaxN = 4;
constexpr int kMaxMix = (2 + kMaxN) * kMaxN;  // 24
constexpr int kThreads = 256;
constexpr int kPartThreads = 128;
constexpr int kMhcParts = 32;  // chunks of a token's n·D vector in the split form

template <typename T>
__device__ __forceinline__ float ld(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p; else return __bfloat162float(*p);
}
template <typename T>
__device__ __forceinline__ void st(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) *p = v; else *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// post and the Sinkhorn-normalised comb of one token from its sums mix_in[0..NMIX) (fn dots),
// `inv` = 1/RMS of its flattened n·D vector; computed by ONE WARP (every lane calls it). Lane
// 4j + k (< 16) holds comb entry (j, k), so row sums reduce over lanes xor 1, 2 and column sums
// over lanes xor 4, 8; everything stays in registers (a single thread with runtime-indexed arrays
// spent ~75 µs per call in local memory).
__device__ void mhc_post_comb(const float* mix_in, float inv, int64_t t,
                              const float* __restrict__ base, const float* __restrict__ scale,
                              int n, int iters, float hc_eps, float* __restrict__ post,
                              float* __restrict__ comb) {
  const int lane = threadIdx.x & 31;
  if (lane < n) post[t * n + lane] = 2.f * sigmoidf(mix_in[n + lane] * inv * scale[1] + base[n + lane]);
  const int j = (lane >> 2) & 3, k = lane & 3;
  const bool valid = lane < 16 && j < n && k < n;
  const int m = 2 * n + j * n + k;
  float c = valid ? mix_in[m] * inv * scale[2] + base[m] : -INFINITY;
  // Row softmax (over k), + hc_eps.
  float mx = c;
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  c = valid ? expf(c - mx) : 0.f;
  auto row_sum = [](float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
  };
  auto col_sum = [](float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v + __shfl_xor_sync(0xffffffffu, v, 8);
  };
  float sum = row_sum(c);
  c = valid ? c / sum + hc_eps : 0.f;
  // Sinkhorn: column normalisation, then (iters − 1) × (row, column).
  float cs = col_sum(c);
  c = valid ? c / (cs + hc_eps) : 0.f;
  for (int it = 1; it < iters; ++it) {
    const float rs = row_sum(c);
    c = valid ? c / (rs + hc_eps) : 0.f;
    cs = col_sum(c);
    c = valid ? c / (cs + hc_eps) : 0.f;
  }
  if (valid) comb[(t * n + j) * n + k] = c;
}

// Coefficients of one token from its sums mix_in[0..NMIX) (fn dots) and mix_in[NMIX] (sum of
// squares), computed by ONE WARP (every lane of warp 0 calls it): pre (to pre_s), then post and
// comb (mhc_post_comb; skipped for the head).
template <int NMIX>
__device__ void mhc_coefficients(const float* mix_in, int64_t t, const float* __restrict__ base,
                                 const float* __restrict__ scale, int n, int iters, float rms_eps,
                                 float hc_eps, int n_mix, int64_t nD, bool head, float* pre_s,
                                 float* __restrict__ post, float* __restrict__ comb) {
  (void)n_mix;
  const int lane = threadIdx.x & 31;
  const float inv = rsqrtf(mix_in[NMIX] / float(nD) + rms_eps);
  if (lane < n) pre_s[lane] = sigmoidf(mix_in[lane] * inv * scale[0] + base[lane]) + hc_eps;
  if (head) return;
  mhc_post_comb(mix_in, inv, t, base, scale, n, iters, hc_eps, post, comb);
}

// One block per token. Accumulates sum of squares and n_mix dot products over the flattened
// n·D vector, reduces them through shared memory, computes the coefficients on thread 0, then
// writes the collapsed stream. `head` = HyperHead (n mix outputs, pre only).
template <typename T, int NMIX>
__global__ void __launch_bounds__(kThreads) mhc_pre_kernel(
    const T* __restrict__ h, const float* __restrict__ fn, const float* __restrict__ base,
    const float* __restrict__ scale, int n, int iters, float rms_eps, float hc_eps, int n_mix,
    bool head, T* __restrict__ collapsed, float* __restrict__ post, float* __restrict__ comb,
    int64_t D) {
  const int64_t t = blockIdx.x;
  const int64_t nD = int64_t(n) * D;
  const T* ht = h + t * nD;
  float acc[NMIX + 1];
#pragma unroll
  for (int j = 0; j <= NMIX; ++j) acc[j] = 0.f;
  for (int64_t i = threadIdx.x; i < nD; i += kThreads) {
    float v = ld(ht + i);
    acc[NMIX] += v * v;
#pragma unroll
    for (int j = 0; j < NMIX; ++j)
      if (j < n_mix) acc[j] += v * fn[j * nD + i];
  }
  __shared__ float red[kThreads / 32][NMIX + 1];
  __shared__ float pre_s[kMaxN];
#pragma unroll
  for (int j = 0; j <= NMIX; ++j) {
    float v = acc[j];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][j] = v;
  }
  __syncthreads();
  __shared__ float mix_s[NMIX + 1];
  if (threadIdx.x <= NMIX) {
    float v = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) v += red[w][threadIdx.x];
    mix_s[threadIdx.x] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32)
    mhc_coefficients<NMIX>(mix_s, t, base, scale, n, iters, rms_eps, hc_eps, n_mix, nD, head,
                           pre_s, post, comb);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float v = 0.f;
    for (int s = 0; s < n; ++s) v += pre_s[s] * ld(ht + s * D + d);
    st(collapsed + t * D + d, v);
  }
}

// Split form of mhc_pre_kernel for small S (decode): one token's n·D vector is cut into
// kMhcParts fixed chunks (fixed whatever S is, so the sums do not depend on the batch), one block
// per (chunk, token) writes its NMIX + 1 partial sums (fn dots, then the sum of squares) to
// part[t, chunk, :]; mhc_finish_kernel adds the chunks in order, computes the coefficients and
// the collapsed stream. The single-block kernel reads fn ((2+n)·n·n·D floats = 1.5 MB for
// V4-Flash) with one SM per token; this spreads it over kMhcParts SMs.
template <typename T, int NMIX>
__global__ void __launch_bounds__(kPartThreads) mhc_partial_kernel(const T* __restrict__ h,
                                                                   const float* __restrict__ fn,
                                                                   int n, int n_mix, int64_t D,
                                                                   float* __restrict__ part) {
  const int64_t t = blockIdx.y;
  const int64_t nD = int64_t(n) * D;
  const int64_t chunk = (nD + kMhcParts - 1) / kMhcParts;
  const int64_t i0 = int64_t(blockIdx.x) * chunk, i1 = i0 + chunk < nD ? i0 + chunk : nD;
  const T* ht = h + t * nD;
  float acc[NMIX + 1];
#pragma unroll
  for (int j = 0; j <= NMIX; ++j) acc[j] = 0.f;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += kPartThreads) {
    const float v = ld(ht + i);
    acc[NMIX] += v * v;
#pragma unroll
    for (int j = 0; j < NMIX; ++j)
      if (j < n_mix) acc[j] += v * __ldg(fn + j * nD + i);
  }
  __shared__ float red[kPartThreads / 32][NMIX + 1];
#pragma unroll
  for (int j = 0; j <= NMIX; ++j) {
    float v = acc[j];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][j] = v;
  }
  __syncthreads();
  if (threadIdx.x <= NMIX) {
    float v = 0.f;
    for (int w = 0; w < kPartThreads / 32; ++w) v += red[w][threadIdx.x];
    part[(t * kMhcParts + blockIdx.x) * (NMIX + 1) + threadIdx.x] = v;
  }
}

template <typename T, int NMIX>
__global__ void __launch_bounds__(kThreads) mhc_finish_kernel(
    const T* __restrict__ h, const float* __restrict__ part, const float* __restrict__ base,
    const float* __restrict__ scale, int n, int iters, float rms_eps, float hc_eps, int n_mix,
    bool head, T* __restrict__ collapsed, float* __restrict__ post, float* __restrict__ comb,
    int64_t D) {
  const int64_t t = blockIdx.x;
  const int64_t nD = int64_t(n) * D;
  __shared__ float mix_s[NMIX + 1];
  __shared__ float pre_s[kMaxN];
  if (threadIdx.x <= NMIX) {
    float v = 0.f;
    for (int c = 0; c < kMhcParts; ++c) v += part[(t * kMhcParts + c) * (NMIX + 1) + threadIdx.x];
    mix_s[threadIdx.x] = v;
  }
  __syncthreads();
  if (threadIdx.x < 32)
    mhc_coefficients<NMIX>(mix_s, t, base, scale, n, iters, rms_eps, hc_eps, n_mix, nD, head,
                           pre_s, post, comb);
  __syncthreads();
  const T* ht = h + t * nD;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float v = 0.f;
    for (int s = 0; s < n; ++s) v += pre_s[s] * ld(ht + s * D + d);
    st(collapsed + t * D + d, v);
  }
}

template <typename T>
__global__ void mhc_post_kernel(const T* h, const T* __restrict__ f, const float* __restrict__ post,
                                const float* __restrict__ comb, T* h_out, int64_t S, int n,
                                int64_t D) {
  int64_t total = S * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / D, d = i - t * D;
    float hv[kMaxN];
    for (int j = 0; j < n; ++j) hv[j] = ld(h + (t * n + j) * D + d);
    float fv = ld(f + t * D + d);
    for (int k = 0; k < n; ++k) {
      float v = post[t * n + k] * fv;
      for (int j = 0; j < n; ++j) v += comb[(t * n + j) * n + k] * hv[j];
      st(h_out + (t * n + k) * D + d, v);
    }
  }
}

// ---- fused mHC (mhc_fused, mhc_post_add) ------------------------------------------------------
constexpr int kFThreads = 256;
constexpr int kFWarps = kFThreads / 32;
constexpr int kFMaxG = 16;  // tokens per CTA (a group), at most
static_assert(kMhcFusedParts == 64, "the finishing CTA adds the chunks as 2 halves of 32");

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// One step of the butterfly transpose-reduce: lanes with bit W set keep the upper half of their
// W·2 live values and send the lower half, the others the reverse.
template <int W, int V>
__device__ __forceinline__ void transpose_step(float (&v)[V], int lane) {
  if constexpr (W >= 1) {
    const bool upper = (lane & W) != 0;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float send = upper ? v[i] : v[i + W];
      const float keep = upper ? v[i + W] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, W);
    }
    transpose_step<W / 2, V>(v, lane);
  }
}

// Warp sums of V values at once (V = 8 or 32): returns, in lane L, Σ over the 32 lanes of
// v[L mod V] (V − 1 + log2(32/V) shuffles instead of V·5). The order of the additions depends on
// the lane only, so the result is deterministic.
template <int V>
__device__ __forceinline__ float warp_transpose_sum(float (&v)[V], int lane) {
  transpose_step<V / 2, V>(v, lane);
  float r = v[0];
#pragma unroll
  for (int o = V; o < 32; o <<= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// Collapsed stream and its RMSNorm for one token, split over kCParts warps ("parts"). Part p's
// lane L owns the 4-element groups d0 = 4·L + 128·p + 256·m (m = 0, 1, …): the 128-wide slices of
// D alternate between the two parts. Pass 1 (mhc_collapse_part) writes the collapsed values and
// returns the part's sum of squares (lane-ordered FMA chain, then a fixed xor tree, the same in
// every lane); the caller adds the parts in part order; pass 2 (mhc_norm_part) scales the part's
// own collapsed values. The float4 path (D % 4 == 0, 16-byte aligned pointers) and the scalar path
// visit the same d in the same order, so they give the same bits; the partition depends only on D,
// never on S or the grouping (batch-invariant). Loads are batched 4 groups at a time before any
// store (the stores alias nothing we read, but the compiler cannot know).
constexpr int kCParts = 2;

__device__ __forceinline__ bool mhc_vec_ok(const MhcFusedArgs& a) {
  const float* cbase = a.collapsed ? a.collapsed : a.x;
  return (a.D & 3) == 0 && aligned16(a.h) && aligned16(cbase) && (!a.x || aligned16(a.x)) &&
         (!a.norm_weight || aligned16(a.norm_weight));
}

__device__ float mhc_collapse_part(const MhcFusedArgs& a, const float* mix, int nmix_slot,
                                   int64_t t, int part) {
  const int lane = threadIdx.x & 31;
  const int n = a.n;
  const int64_t D = a.D, nD = int64_t(n) * D;
  const float inv = rsqrtf(mix[nmix_slot] / float(nD) + a.rms_eps);
  float pre[kMaxN];
#pragma unroll
  for (int s = 0; s < kMaxN; ++s)
    pre[s] = s < n ? sigmoidf(mix[s] * inv * a.scale[0] + a.base[s]) + a.hc_eps : 0.f;
  const float* ht = a.h + t * nD;
  float* cb = (a.collapsed ? a.collapsed : a.x) + t * D;
  constexpr int kStride = 128 * kCParts;  // between one lane's consecutive 4-element groups
  constexpr int kB = 4;                   // groups per batch
  float ss = 0.f;
  if (mhc_vec_ok(a)) {
    for (int64_t d0 = 4 * lane + 128 * part; d0 < D; d0 += kStride * kB) {
      float4 hv[kB][kMaxN];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int64_t d = d0 + kStride * b;
#pragma unroll
        for (int s = 0; s < kMaxN; ++s)
          hv[b][s] = d < D && s < n ? *reinterpret_cast<const float4*>(ht + s * D + d)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int64_t d = d0 + kStride * b;
        if (d >= D) break;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < kMaxN; ++s)
          if (s < n) {
            acc.x += pre[s] * hv[b][s].x;
            acc.y += pre[s] * hv[b][s].y;
            acc.z += pre[s] * hv[b][s].z;
            acc.w += pre[s] * hv[b][s].w;
          }
        *reinterpret_cast<float4*>(cb + d) = acc;
        ss += acc.x * acc.x;
        ss += acc.y * acc.y;
        ss += acc.z * acc.z;
        ss += acc.w * acc.w;
      }
    }
  } else {
    for (int64_t d0 = 4 * lane + 128 * part; d0 < D; d0 += kStride) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t d = d0 + e;
        float v = 0.f;
        if (d < D) {
#pragma unroll
          for (int s = 0; s < kMaxN; ++s)
            if (s < n) v += pre[s] * ht[s * D + d];
          cb[d] = v;
        }
        ss += v * v;
      }
    }
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  return __shfl_sync(0xffffffffu, ss, 0);  // one value for every lane (the xor tree may differ)
}

// Pass 2 of part `part` (see mhc_collapse_part): x[t, d] = collapsed[t, d] · (ss/D + eps)^-1/2 ·
// w[d] over the part's own d (the same lane wrote them in pass 1). Needs a.x.
__device__ void mhc_norm_part(const MhcFusedArgs& a, float ss, int64_t t, int part) {
  const int lane = threadIdx.x & 31;
  const int64_t D = a.D;
  const float* cb = (a.collapsed ? a.collapsed : a.x) + t * D;
  float* xr = a.x + t * D;
  const float* w = a.norm_weight;
  const float inv2 = rsqrtf(ss / float(D) + a.norm_eps);
  constexpr int kStride = 128 * kCParts;
  if (mhc_vec_ok(a)) {
    constexpr int kB2 = 8;  // groups per batch of the second pass (2 float4 each)
    for (int64_t d0 = 4 * lane + 128 * part; d0 < D; d0 += kStride * kB2) {
      float4 cv[kB2], wv[kB2];
#pragma unroll
      for (int b = 0; b < kB2; ++b) {
        const int64_t d = d0 + kStride * b;
        cv[b] = d < D ? *reinterpret_cast<const float4*>(cb + d) : make_float4(0.f, 0.f, 0.f, 0.f);
        wv[b] = d < D && w ? *reinterpret_cast<const float4*>(w + d)
                           : make_float4(1.f, 1.f, 1.f, 1.f);
      }
#pragma unroll
      for (int b = 0; b < kB2; ++b) {
        const int64_t d = d0 + kStride * b;
        if (d >= D) break;
        float4 v = make_float4(cv[b].x * inv2, cv[b].y * inv2, cv[b].z * inv2, cv[b].w * inv2);
        if (w) {
          v.x *= wv[b].x;
          v.y *= wv[b].y;
          v.z *= wv[b].z;
          v.w *= wv[b].w;
        }
        *reinterpret_cast<float4*>(xr + d) = v;
      }
    }
  } else {
    for (int64_t d0 = 4 * lane + 128 * part; d0 < D; d0 += kStride)
      for (int e = 0; e < 4; ++e) {
        const int64_t d = d0 + e;
        if (d >= D) break;
        float v = cb[d] * inv2;
        if (w) v *= w[d];
        xr[d] = v;
      }
  }
}

// mhc_fused: grid (kMhcFusedParts, groups of G tokens), kFThreads threads. NMIX = kMaxMix (pre
// site) or kMaxN (head). Phase 1 (every CTA): for each token of the group, the fn dots and the
// sum of squares over the CTA's chunk of the n·D vector (thread-strided FMA chains, warp
// transpose-reduce, warps added in order) → work[t, chunk, 0..NMIX]. Phase 2 (the group's last
// CTA): chunk sums in a fixed order (two halves of 32, then their sum) → mix_s; then one warp per
// job: Sinkhorn (post, comb) of token g, or one of the kCParts parts of token g's collapsed stream
// + RMSNorm (two passes around one block barrier). OT > 0: groups of at most OT tokens whose
// chunk fits one element per thread take phase 1's one-round-trip form (OT = 2 for decode-sized
// calls, kFMaxG above: its per-token arrays and shared sums are sized by OT); OT = 0: the
// strided loop for every call (the form all calls had before the one-round-trip path).
template <int NMIX, int OT>
__global__ void __launch_bounds__(kFThreads) mhc_fused_kernel(const MhcFusedArgs a, int G,
                                                              float* __restrict__ work,
                                                              int* __restrict__ counters,
                                                              bool phase2_only) {
  constexpr int NV = NMIX + 1;
  constexpr int V = NV <= 8 ? 8 : 32;
  static_assert(NV <= V && NV <= 32, "partial sums per token");
  const int n = a.n;
  const int n_mix = a.head ? n : (2 + n) * n;
  const int64_t nD = int64_t(n) * a.D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x;
  const int64_t t0 = int64_t(blockIdx.y) * G;
  const int gn = int(a.S - t0 < G ? a.S - t0 : G);
  const int64_t chunk = (nD + kMhcFusedParts - 1) / kMhcFusedParts;
  const int64_t i0 = c * chunk;
  const int64_t i1 = i0 + chunk < nD ? i0 + chunk : nD;

  __shared__ float red[kFWarps][V];
  __shared__ float red_g[OT > 0 ? OT : 1][kFWarps][V];  // one-round-trip path: each token's warp sums
  __shared__ float half_s[2][kFMaxG][32];
  __shared__ float mix_s[kFMaxG][32];
  __shared__ float ss_s[kFMaxG][kCParts];
  __shared__ int last_s;

  // The one-round-trip form needs the group within its arrays (gn ≤ OT; the host picks OT ≥ G)
  // and one element per thread; otherwise the loop below (uniform per CTA).
  const bool one_trip = OT > 0 && gn <= OT && chunk <= kFThreads;
  if (phase2_only) goto phase2;  // work already holds every chunk's sums (mhc_partials_dfs_kernel)
  if (one_trip) {
    // At most one element per thread (n·D ≤ 64·kFThreads: V4-Flash's 4 × 4096): the thread's 24
    // fn values are loaded once for the whole group and every token's h value is in flight at
    // once — one DRAM round trip per CTA instead of one per token (a prefill call of 2,048 tokens
    // was ~1 ms of such dependent round trips). The per-token arithmetic is the loop's below with
    // its single iteration (acc = 0 + v·f, the same FMAs), the warp sums the same transpose-reduce
    // and the warps added in the same order: the same bits.
    const int64_t i = i0 + threadIdx.x;
    const bool has = i < i1;
    float f[NMIX];
#pragma unroll
    for (int j = 0; j < NMIX; ++j) f[j] = has && j < n_mix ? __ldg(a.fn + j * nD + i) : 0.f;
    constexpr int kG = OT > 0 ? OT : 1;
    float hv[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) hv[g] = has && g < gn ? a.h[(t0 + g) * nD + i] : 0.f;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g >= gn) break;  // uniform
      float acc[V];
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = 0.f;
      if (has) {
        const float v = hv[g];
        acc[NMIX] += v * v;
#pragma unroll
        for (int j = 0; j < NMIX; ++j)
          if (j < n_mix) acc[j] += v * f[j];
      }
      const float r = warp_transpose_sum<V>(acc, lane);
      if (lane < V) red_g[g][warp][lane] = r;
    }
    __syncthreads();
    for (int q = threadIdx.x; q < gn * NV; q += kFThreads) {
      const int g = q / NV, j = q - g * NV;
      float s = red_g[g][0][j];
#pragma unroll
      for (int w = 1; w < kFWarps; ++w) s += red_g[g][w][j];
      work[((t0 + g) * kMhcFusedParts + c) * NV + j] = s;
    }
  }
  for (int g = 0; g < gn && !one_trip; ++g) {
    const float* ht = a.h + (t0 + g) * nD;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += kFThreads) {
      const float v = ht[i];
      acc[NMIX] += v * v;
#pragma unroll
      for (int j = 0; j < NMIX; ++j)
        if (j < n_mix) acc[j] += v * __ldg(a.fn + j * nD + i);
    }
    const float r = warp_transpose_sum<V>(acc, lane);
    if (lane < V) red[warp][lane] = r;
    __syncthreads();
    if (threadIdx.x < NV) {
      float s = red[0][threadIdx.x];
#pragma unroll
      for (int w = 1; w < kFWarps; ++w) s += red[w][threadIdx.x];
      work[((t0 + g) * kMhcFusedParts + c) * NV + threadIdx.x] = s;
    }
    __syncthreads();
  }

  // The last CTA of the group to finish phase 1 runs phase 2 (threadfence-reduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_s = atomicAdd(counters + blockIdx.y, 1) == kMhcFusedParts - 1;
  __syncthreads();
  if (!last_s) return;
  __threadfence();
phase2:
  for (int q = threadIdx.x; q < 2 * kFMaxG * 32; q += kFThreads) {
    const int hf = q / (kFMaxG * 32), g = (q / 32) % kFMaxG, j = q % 32;
    if (g < gn && j < NV) {
      const float* p = work + ((t0 + g) * kMhcFusedParts + hf * 32) * NV + j;
      float s = 0.f;
#pragma unroll
      for (int cc = 0; cc < 32; ++cc) s += __ldcg(p + cc * NV);  // 32 loads in flight, in order
      half_s[hf][g][j] = s;
    }
  }
  __syncthreads();
  for (int q = threadIdx.x; q < kFMaxG * 32; q += kFThreads) {
    const int g = q / 32, j = q % 32;
    if (g < gn && j < NV) mix_s[g][j] = half_s[0][g][j] + half_s[1][g][j];
  }
  if (threadIdx.x == 0 && !phase2_only) counters[blockIdx.y] = 0;  // every CTA has counted
  __syncthreads();
  // Round 1, one warp per job: jobs [0, n_sk) Sinkhorn of token job; then kCParts collapse parts
  // per token. Round 2 (after a barrier: every part's sum of squares is in ss_s): the norm parts.
  const int n_sk = a.head ? 0 : gn;
  const int n_jobs = n_sk + kCParts * gn;
  for (int job = warp; job < n_jobs; job += kFWarps) {
    if (job < n_sk) {
      const float inv = rsqrtf(mix_s[job][NMIX] / float(nD) + a.rms_eps);
      mhc_post_comb(mix_s[job], inv, t0 + job, a.base, a.scale, n, a.sinkhorn_iters, a.hc_eps,
                    a.post, a.comb);
    } else {
      const int g = (job - n_sk) / kCParts, p = (job - n_sk) % kCParts;
      const float ss = mhc_collapse_part(a, mix_s[g], NMIX, t0 + g, p);
      if (lane == 0) ss_s[g][p] = ss;
    }
  }
  if (!a.x) return;
  __syncthreads();
  for (int job = warp; job < kCParts * gn; job += kFWarps) {
    const int g = job / kCParts, p = job % kCParts;
    float ss = ss_s[g][0];
#pragma unroll
    for (int q = 1; q < kCParts; ++q) ss += ss_s[g][q];  // part order: fixed
    mhc_norm_part(a, ss, t0 + g, p);
  }
}

// Phase 1 of mhc_fused_kernel<kMaxMix> for prefill-sized calls, with fewer instructions: the same
// work[t, c, j] values, bit for bit. There, lane L of warp w holds element i0 + 32·w + L of chunk
// c, its products acc_j = 0 + v·fn_j (v·v for j = NMIX) are summed over the 32 lanes by
// warp_transpose_sum<32> — which adds lanes xor 16 first, then xor 8, 4, 2, 1: the tree
// ((p0 + p16) + (p8 + p24)) + … — and the 8 warps' sums are added in warp order. Here one thread
// computes that tree itself for 4 tokens × 5 j's over one 32-element warp slice, visiting the 16
// pairs (x, x + 16) in bit-reversed order so that each level's partner is the next value (the
// transposes cost ~5× the FMAs: ncu, bench/results/ncu-mhc-prefill-s19.txt, 70% issue-bound).
// Grid (kMhcFusedParts chunks, ceil(S / kDfsTok) token tiles), kDfsThreads threads: thread =
// (j block jb = warp, token quad tq, warp slice w). Needs chunk ≤ kFThreads (n·D ≤ 16,384).
constexpr int kDfsTok = 16;
constexpr int kDfsThreads = 160;  // 5 j blocks × 4 token quads × 8 warp slices
constexpr int kDfsWs = 33;        // shared-memory stride of a 32-element warp slice (+1: banks)
constexpr int kDfsHs = 8 * kDfsWs + 2;  // token stride of the h tile: the 4 quads on distinct banks
__global__ void __launch_bounds__(kDfsThreads) mhc_partials_dfs_kernel(const MhcFusedArgs a,
                                                                       float* __restrict__ work) {
  constexpr int NMIX = kMaxMix, NV = NMIX + 1;
  __shared__ float fn_s[NMIX * 8 * kDfsWs];  // fn_j of the chunk's element 32·w + x
  __shared__ float h_s[kDfsTok * kDfsHs];
  const int n = a.n, n_mix = (2 + n) * n;
  const int64_t nD = int64_t(n) * a.D;
  const int64_t chunk = (nD + kMhcFusedParts - 1) / kMhcFusedParts;
  const int c = blockIdx.x;
  const int64_t i0 = c * chunk;
  const int64_t i1 = i0 + chunk < nD ? i0 + chunk : nD;
  const int64_t t0 = int64_t(blockIdx.y) * kDfsTok;
  const int tn = int(a.S - t0 < kDfsTok ? a.S - t0 : kDfsTok);
  // Elements outside the chunk (or of the unused fn rows j ≥ n_mix) are 0: their products 0·0 + 0
  // are the +0 the shuffle form's untouched accumulators hold.
  if (nD == int64_t(kMhcFusedParts) * 256 && ((reinterpret_cast<uintptr_t>(a.fn) |
                                           reinterpret_cast<uintptr_t>(a.h)) & 15) == 0) {
    // Full chunks (V4-Flash: n·D = 16,384): float4 loads, 4 elements of one warp slice each.
    for (int q = threadIdx.x; q < NMIX * 64; q += kDfsThreads) {
      const int j = q >> 6, e = (q & 63) * 4;
      const float4 v = j < n_mix ? __ldg(reinterpret_cast<const float4*>(a.fn + j * nD + i0 + e))
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      float* d = fn_s + j * 8 * kDfsWs + (e >> 5) * kDfsWs + (e & 31);
      d[0] = v.x;
      d[1] = v.y;
      d[2] = v.z;
      d[3] = v.w;
    }
    for (int q = threadIdx.x; q < kDfsTok * 64; q += kDfsThreads) {
      const int t = q >> 6, e = (q & 63) * 4;
      const float4 v = t < tn ? *reinterpret_cast<const float4*>(a.h + (t0 + t) * nD + i0 + e)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
      float* d = h_s + t * kDfsHs + (e >> 5) * kDfsWs + (e & 31);
      d[0] = v.x;
      d[1] = v.y;
      d[2] = v.z;
      d[3] = v.w;
    }
  } else {
    for (int q = threadIdx.x; q < NMIX * 256; q += kDfsThreads) {
      const int j = q >> 8, e = q & 255;
      fn_s[j * 8 * kDfsWs + (e >> 5) * kDfsWs + (e & 31)] =
          j < n_mix && i0 + e < i1 ? __ldg(a.fn + j * nD + i0 + e) : 0.f;
    }
    for (int q = threadIdx.x; q < kDfsTok * 256; q += kDfsThreads) {
      const int t = q >> 8, e = q & 255;
      h_s[t * kDfsHs + (e >> 5) * kDfsWs + (e & 31)] =
          t < tn && i0 + e < i1 ? a.h[(t0 + t) * nD + i0 + e] : 0.f;
    }
  }
  __syncthreads();
  const int w = threadIdx.x & 7, tq = (threadIdx.x >> 3) & 3, jb = threadIdx.x >> 5;
  const float* hq = h_s + (tq * 4) * kDfsHs + w * kDfsWs;
  const float* fq = fn_s + (jb * 5) * 8 * kDfsWs + w * kDfsWs;
  float l1[4][5], l2[4][5], l3[4][5], l4[4][5], tree[4][5];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int x = ((k & 1) << 3) | ((k & 2) << 1) | ((k & 4) >> 1) | ((k & 8) >> 3);  // bitrev4
    float h0[4], h1[4], f0[5], f1[5];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      h0[u] = hq[u * kDfsHs + x];
      h1[u] = hq[u * kDfsHs + x + 16];
    }
#pragma unroll
    for (int jj = 0; jj < 5; ++jj) {
      if (jb == 4 && jj == 4) break;  // j = NMIX: the sum of squares (warp-uniform)
      f0[jj] = fq[jj * 8 * kDfsWs + x];
      f1[jj] = fq[jj * 8 * kDfsWs + x + 16];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int jj = 0; jj < 5; ++jj) {
        const bool sq = jb == 4 && jj == 4;
        const float a0 = sq ? h0[u] : f0[jj], a1 = sq ? h1[u] : f1[jj];
        const float p = __fadd_rn(__fmaf_rn(h0[u], a0, 0.f), __fmaf_rn(h1[u], a1, 0.f));
        // Levels: pairs (x, x+8) are k, k+1; then (x, x+4) k pairs 2 apart, (x, x+2), (x, x+1).
        if ((k & 1) == 0) {
          l1[u][jj] = p;
        } else {
          const float v2 = __fadd_rn(l1[u][jj], p);
          if ((k & 2) == 0) {
            l2[u][jj] = v2;
          } else {
            const float v3 = __fadd_rn(l2[u][jj], v2);
            if ((k & 4) == 0) {
              l3[u][jj] = v3;
            } else {
              const float v4 = __fadd_rn(l3[u][jj], v3);
              if ((k & 8) == 0) l4[u][jj] = v4;
              else tree[u][jj] = __fadd_rn(l4[u][jj], v4);
            }
          }
        }
      }
  }
  __syncthreads();  // everyone is done with fn_s: it becomes red[w][t][j]
  float* red = fn_s;
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int jj = 0; jj < 5; ++jj) red[(w * kDfsTok + tq * 4 + u) * NV + jb * 5 + jj] = tree[u][jj];
  __syncthreads();
  for (int q = threadIdx.x; q < tn * NV; q += kDfsThreads) {
    const int t = q / NV, j = q - t * NV;
    float sum = red[t * NV + j];
#pragma unroll
    for (int ww = 1; ww < 8; ++ww) sum = __fadd_rn(sum, red[(ww * kDfsTok + t) * NV + j]);
    work[((t0 + t) * kMhcFusedParts + c) * NV + j] = sum;
  }
}
static_assert(kDfsTok * 8 * (kMaxMix + 1) <= kMaxMix * 8 * kDfsWs, "red fits in fn_s");

// h_out[t, k] = post[t, k]·(f[t] + f_add[t]) + Σ_j comb[t, j, k]·h[t, j]; one thread per 4
// channels (float4 when D % 4 == 0 and the pointers are 16-byte aligned) or per channel.
__global__ void mhc_post_add_kernel(const float* h, const float* __restrict__ f,
                                    const float* __restrict__ f_add,
                                    const float* __restrict__ post,
                                    const float* __restrict__ comb, float* h_out, int64_t S,
                                    int n, int64_t D, bool vec) {
  const int64_t units = vec ? D / 4 : D;
  const int64_t total = S * units;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / units, u = i - t * units;
    float pk[kMaxN], cm[kMaxN][kMaxN];
#pragma unroll
    for (int j = 0; j < kMaxN; ++j) {
      pk[j] = j < n ? post[t * n + j] : 0.f;
#pragma unroll
      for (int k = 0; k < kMaxN; ++k) cm[j][k] = j < n && k < n ? comb[(t * n + j) * n + k] : 0.f;
    }
    if (vec) {
      const int64_t d = 4 * u;
      float4 hv[kMaxN];
#pragma unroll
      for (int j = 0; j < kMaxN; ++j)
        hv[j] = j < n ? *reinterpret_cast<const float4*>(h + (t * n + j) * D + d)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      float4 fv = *reinterpret_cast<const float4*>(f + t * D + d);
      if (f_add) {
        const float4 av = *reinterpret_cast<const float4*>(f_add + t * D + d);
        fv.x += av.x;
        fv.y += av.y;
        fv.z += av.z;
        fv.w += av.w;
      }
#pragma unroll
      for (int k = 0; k < kMaxN; ++k) {
        if (k >= n) break;
        float4 v = make_float4(pk[k] * fv.x, pk[k] * fv.y, pk[k] * fv.z, pk[k] * fv.w);
#pragma unroll
        for (int j = 0; j < kMaxN; ++j)
          if (j < n) {
            v.x += cm[j][k] * hv[j].x;
            v.y += cm[j][k] * hv[j].y;
            v.z += cm[j][k] * hv[j].z;
            v.w += cm[j][k] * hv[j].w;
          }
        *reinterpret_cast<float4*>(h_out + (t * n + k) * D + d) = v;
      }
    } else {
      const int64_t d = u;
      float hv[kMaxN];
#pragma unroll
      for (int j = 0; j < kMaxN; ++j) hv[j] = j < n ? h[(t * n + j) * D + d] : 0.f;
      float fv = f[t * D + d];
      if (f_add) fv += f_add[t * D + d];
#pragma unroll
      for (int k = 0; k < kMaxN; ++k) {
        if (k >= n) break;
        float v = pk[k] * fv;
#pragma unroll
        for (int j = 0; j < kMaxN; ++j)
          if (j < n) v += cm[j][k] * hv[j];
        h_out[(t * n + k) * D + d] = v;
      }
    }
  }
}

}  // namespace

template <typename T>
Status mhc_pre(const T* h, const MhcParams& p, T* collapsed, float* post, float* comb, int64_t S,
               int64_t D, cudaStream_t stream, float* work) {
  if (p.n < 1 || p.n > kMaxN || D < 1 || p.sinkhorn_iters < 1)
    return errorf(ErrorCode::kInvalidArgument, "mhc_pre: n={} D={} iters={} (n must be 1..4)",
                      p.n, D, p.sinkhorn_iters);
  if (S <= 0) return Status::Ok();
  const int n_mix = (2 + p.n) * p.n;
  if (work) {
    mhc_partial_kernel<T, kMaxMix><<<dim3(kMhcParts, unsigned(S)), kPartThreads, 0, stream>>>(
        h, p.fn, p.n, n_mix, D, work);
    V4_CUDA_CHECK_LAUNCH("mhc_partial_kernel");
    mhc_finish_kernel<T, kMaxMix><<<unsigned(S), kThreads, 0, stream>>>(
        h, work, p.base, p.scale, p.n, p.sinkhorn_iters, p.rms_eps, p.hc_eps, n_mix, false,
        collapsed, post, comb, D);
    V4_CUDA_CHECK_LAUNCH("mhc_finish_kernel");
    return Status::Ok();
  }
  mhc_pre_kernel<T, kMaxMix><<<unsigned(S), kThreads, 0, stream>>>(
      h, p.fn, p.base, p.scale, p.n, p.sinkhorn_iters, p.rms_eps, p.hc_eps, n_mix, false,
      collapsed, post, comb, D);
  V4_CUDA_CHECK_LAUNCH("mhc_pre_kernel");
  return Status::Ok();
}

template <typename T>
Status mhc_head(const T* h, const float* hc_fn, const float* hc_base, const float* hc_scale, int n,
                float rms_eps, float hc_eps, T* y, int64_t S, int64_t D, cudaStream_t stream,
                float* work) {
  if (n < 1 || n > kMaxN || D < 1)
    return errorf(ErrorCode::kInvalidArgument, "mhc_head: n={} D={}", n, D);
  if (S <= 0) return Status::Ok();
  if (work) {
    mhc_partial_kernel<T, kMaxN><<<dim3(kMhcParts, unsigned(S)), kPartThreads, 0, stream>>>(
        h, hc_fn, n, n, D, work);
    V4_CUDA_CHECK_LAUNCH("mhc_partial_kernel");
    mhc_finish_kernel<T, kMaxN><<<unsigned(S), kThreads, 0, stream>>>(
        h, work, hc_base, hc_scale, n, 1, rms_eps, hc_eps, n, true, y, nullptr, nullptr, D);
    V4_CUDA_CHECK_LAUNCH("mhc_head_finish_kernel");
    return Status::Ok();
  }
  mhc_pre_kernel<T, kMaxN><<<unsigned(S), kThreads, 0, stream>>>(
      h, hc_fn, hc_base, hc_scale, n, 1, rms_eps, hc_eps, n, true, y, nullptr, nullptr, D);
  V4_CUDA_CHECK_LAUNCH("mhc_head_kernel");
  return Status::Ok();
}

template <typename T>
Status mhc_post(const T* h, const T* f, const float* post, const float* comb, T* h_out, int64_t S,
                int n, int64_t D, cudaStream_t stream) {
  if (n < 1 || n > kMaxN || D < 1)
    return errorf(ErrorCode::kInvalidArgument, "mhc_post: n={} D={}", n, D);
  int64_t total = S * D;
  if (total <= 0) return Status::Ok();
  int64_t g = (total + 255) / 256;
  mhc_post_kernel<T><<<unsigned(g > 65536 ? 65536 : g), 256, 0, stream>>>(h, f, post, comb, h_out,
                                                                          S, n, D);
  V4_CUDA_CHECK_LAUNCH("mhc_post_kernel");
  return Status::Ok();
}

// V4_MHC_ONE_TRIP (A/B runs): 0 = mhc_fused_kernel's strided loop for every call, 16 = the
// one-round-trip form sized for 16-token groups at every size (the default before session 24);
// otherwise decode-sized groups (G ≤ 2) run the instance sized for 2 tokens, larger groups 16.
static int mhc_one_trip_tokens(int G) {
  const char* v = std::getenv("V4_MHC_ONE_TRIP");
  if (v && v[0] == '0') return 0;
  if (v && std::string(v) == "16") return kFMaxG;
  return G <= 2 ? 2 : kFMaxG;
}

// V4_MHC_DFS=0: prefill-sized mhc_fused calls keep the one-launch shuffle form (A/B runs).
static bool mhc_dfs_enabled() {
  const char* v = std::getenv("V4_MHC_DFS");
  return !(v && v[0] == '0');
}

Status mhc_fused(const MhcFusedArgs& a, float* work, int* counters, cudaStream_t stream) {
  if (a.n < 1 || a.n > kMaxN || a.D < 1 || (!a.head && a.sinkhorn_iters < 1))
    return errorf(ErrorCode::kInvalidArgument, "mhc_fused: n={} D={} iters={} (n must be 1..4)",
                  a.n, a.D, a.sinkhorn_iters);
  if (a.S <= 0) return Status::Ok();
  if (!a.h || !a.fn || !a.base || !a.scale || !work || !counters || (!a.collapsed && !a.x) ||
      (!a.head && (!a.post || !a.comb)))
    return errorf(ErrorCode::kInvalidArgument, "mhc_fused: missing input, output or workspace");
  // Tokens per CTA: G ≤ 2 keeps the finishing CTA's G Sinkhorn + 2·G collapse-part jobs within its
  // 8 warps (one round), and S/2 groups finish on S/2 SMs at once. (G = 8 — the fn chunk reused
  // from L1 by 8 tokens — left 16 jobs on one SM per 8 tokens: 45.7 µs at S = 64 vs 40.3 for the
  // old 3-launch chain, bench/results/cuda-mhc.md.) Prefill-sized calls (S > 256): G = S / 128
  // (≤ kFMaxG), about 128 groups — with G = 2 every group re-read the whole fn matrix (1.5 MB for
  // V4-Flash), 1.5 GB of L2 traffic at S = 2048 and ~1.2 ms a call
  // (bench/results/bench-v4flash-20l-prefill-profile-s17.md). The grouping does not change any sum.
  const int G = a.S <= 2 ? int(a.S) : a.S <= 256 ? 2 : int(std::min<int64_t>(kFMaxG, a.S / 128));
  const int64_t groups = (a.S + G - 1) / G;
  if (groups > 65535 || groups > mhc_fused_counters(a.S))
    return errorf(ErrorCode::kInvalidArgument, "mhc_fused: S = {} rows (at most {})", a.S,
                  int64_t(65535) * kFMaxG);
  const int64_t nD = int64_t(a.n) * a.D;
  const int64_t chunk = (nD + kMhcFusedParts - 1) / kMhcFusedParts;
  if (!a.head && a.S > 256 && a.S <= int64_t(65535) * 4 && chunk <= kFThreads && mhc_dfs_enabled()) {
    // Prefill: the chunk sums by mhc_partials_dfs_kernel (same bits), then the finishing phase
    // alone with 4 tokens a CTA (Sinkhorn, collapse and norm spread over S / 4 CTAs).
    const dim3 pgrid(kMhcFusedParts, unsigned((a.S + kDfsTok - 1) / kDfsTok));
    mhc_partials_dfs_kernel<<<pgrid, kDfsThreads, 0, stream>>>(a, work);
    V4_CUDA_CHECK_LAUNCH("mhc_partials_dfs_kernel");
    constexpr int G2 = 4;
    mhc_fused_kernel<kMaxMix, 0><<<dim3(1, unsigned((a.S + G2 - 1) / G2)), kFThreads, 0, stream>>>(
        a, G2, work, counters, true);
    V4_CUDA_CHECK_LAUNCH("mhc_fused_kernel");
    return Status::Ok();
  }
  const dim3 grid(kMhcFusedParts, unsigned(groups));
  auto launch = [&](auto kernel) { kernel<<<grid, kFThreads, 0, stream>>>(a, G, work, counters, false); };
  const int ot = mhc_one_trip_tokens(G);
  if (a.head) {
    if (ot == 0) launch(mhc_fused_kernel<kMaxN, 0>);
    else if (ot == 2) launch(mhc_fused_kernel<kMaxN, 2>);
    else launch(mhc_fused_kernel<kMaxN, kFMaxG>);
  } else {
    if (ot == 0) launch(mhc_fused_kernel<kMaxMix, 0>);
    else if (ot == 2) launch(mhc_fused_kernel<kMaxMix, 2>);
    else launch(mhc_fused_kernel<kMaxMix, kFMaxG>);
  }
  V4_CUDA_CHECK_LAUNCH("mhc_fused_kernel");
  return Status::Ok();
}

Status mhc_post_add(const float* h, const float* f, const float* f_add, const float* post,
                    const float* comb, float* h_out, int64_t S, int n, int64_t D,
                    cudaStream_t stream) {
  if (n < 1 || n > kMaxN || D < 1)
    return errorf(ErrorCode::kInvalidArgument, "mhc_post_add: n={} D={}", n, D);
  if (S <= 0) return Status::Ok();
  auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = D % 4 == 0 && al(h) && al(f) && (!f_add || al(f_add)) && al(h_out);
  const int64_t total = S * (vec ? D / 4 : D);
  const int64_t threads = 128;
  const int64_t g = (total + threads - 1) / threads;
  mhc_post_add_kernel<<<unsigned(g > 65536 ? 65536 : g), unsigned(threads), 0, stream>>>(
      h, f, f_add, post, comb, h_out, S, n, D, vec);
  V4_CUDA_CHECK_LAUNCH("mhc_post_add_kernel");
  return Status::Ok();
}

#define V4_INST(T)                                                                              \
  template Status mhc_pre<T>(const T*, const MhcParams&, T*, float*, float*, int64_t, int64_t,   \
                             cudaStream_t, float*);                                             \
  template Status mhc_post<T>(const T*, const T*, const float*, const float*, T*, int64_t, int,  \
                              int64_t, cudaStream_t);                                           \
  template Status mhc_head<T>(const T*, const float*, const float*, const float*, int, float,    \
                              float, T*, int64_t, int64_t, cudaStream_t, float*);
V4_INST(float)
V4_INST(__nv_bfloat16)
#undef V4_INST

}  // namespace v4::cuda
