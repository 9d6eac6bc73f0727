#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/mhc.h"

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

// Coefficients of one token from its sums mix_in[0..NMIX) (fn dots) and mix_in[NMIX] (sum of
// squares), computed by ONE WARP (every lane of warp 0 calls it): pre (to pre_s), post and the
// Sinkhorn-normalised comb (skipped for the head). Lane 4j + k (< 16) holds comb entry (j, k), so
// row sums reduce over lanes xor 1, 2 and column sums over lanes xor 4, 8; everything stays in
// registers (a single thread with runtime-indexed arrays spent ~75 µs per call in local memory).
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
