#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
#include "ops/cuda/norm_rope.h"

#include <cstdlib>

namespace v4::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float ld(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p; else return __bfloat162float(*p);
}
template <typename T>
__device__ __forceinline__ void st(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) *p = v; else *p = __float2bfloat16_rn(v);
}

// One block of 256 threads per row; fp32 sum of squares (block reduce through shared memory).
template <typename T>
__global__ void rmsnorm_kernel(const T* __restrict__ x, const float* __restrict__ w, T* out,
                               int64_t D, float eps) {
  const T* xr = x + blockIdx.x * D;
  T* orow = out + blockIdx.x * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float v = ld(xr + i);
    ss += v * v;
  }
  __shared__ float red[32];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  float inv = rsqrtf(red[0] / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float v = ld(xr + i) * inv;
    if (w) v *= w[i];
    st(orow + i, v);
  }
}

template <typename T>
__global__ void rope_kernel(T* x, const int64_t* __restrict__ pos, const float* __restrict__ inv_freq,
                            int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rd,
                            int64_t row_stride, bool inverse, float att) {
  int64_t half = rd / 2;
  int64_t total = rows * n_heads * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t p = i % half;
    int64_t h = (i / half) % n_heads;
    int64_t r = i / (half * n_heads);
    float ang = inv_freq[p] * float(pos[r]);  // one fp32 product, as HF
    float s, c;
    sincosf(ang, &s, &c);
    s *= att;
    c *= att;
    if (inverse) s = -s;
    T* e = x + r * row_stride + h * head_dim + (head_dim - rd) + 2 * p;
    float a = ld(e), b = ld(e + 1);
    st(e, a * c - b * s);
    st(e + 1, a * s + b * c);
  }
}

// One warp per head vector (row r, head h): lane L owns channels c = L + 32·k. Pass 1: sum of
// squares (per-lane chain, xor tree, lane 0's value broadcast). Pass 2 (re-reads x, from L1):
// y = x·inv (·w); pairs (2i, 2i+1) of the trailing rd channels sit in lanes (L, L^1), so the
// partner value comes from one shuffle; the rotation is rope_kernel's (forward).
__global__ void __launch_bounds__(256) rmsnorm_rope_kernel(
    float* x, const float* __restrict__ w, const int64_t* __restrict__ pos,
    const float* __restrict__ inv_freq, int64_t vecs, int64_t n_heads, int64_t hd, int64_t rd,
    float eps, float att) {
  const int lane = threadIdx.x & 31;
  const int64_t v = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (v >= vecs) return;  // warp-uniform
  float* xv = x + v * hd;
  const int64_t r = v / n_heads;
  const int64_t steps = (hd + 31) / 32;
  float ss = 0.f;
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t c = lane + 32 * k;
    const float val = c < hd ? xv[c] : 0.f;
    ss += val * val;
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  ss = __shfl_sync(0xffffffffu, ss, 0);
  const float inv = rsqrtf(ss / float(hd) + eps);
  const int64_t r0 = hd - rd;  // first rotated channel (even)
  const float fpos = float(pos[r]);
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t c = lane + 32 * k;
    float y = 0.f;
    if (c < hd) {
      y = xv[c] * inv;
      if (w) y *= w[c];
    }
    const float partner = __shfl_xor_sync(0xffffffffu, y, 1);  // channel c ^ 1
    if (c >= hd) continue;
    if (c >= r0) {
      const int64_t i = (c - r0) >> 1;
      const float ang = inv_freq[i] * fpos;  // one fp32 product, as rope_kernel
      float sn, cs;
      sincosf(ang, &sn, &cs);
      sn *= att;
      cs *= att;
      // even channel a, odd channel b: (a, b) -> (a·cos − b·sin, a·sin + b·cos)
      y = ((c - r0) & 1) == 0 ? y * cs - partner * sn : partner * sn + y * cs;
    }
    xv[c] = y;
  }
}

// rmsnorm_rope_kernel for head_dim ≤ 512 with the vector held in registers (session 27,
// V4_NORM_ROPE_REGS=1; an A/B form: measured in session 28, the served batch-1 step was no
// faster with it, bench/results/bench-v4flash-20l-normrope-ab-s28.md): every lane issues all its
// loads of x (and w) before any math — one memory round trip instead of a chain of dependent
// loads per channel group (ncu at 4K, batch 1: the one-vector kv call took 9.4 µs, the 64-head q
// call 5.2; bench/results/ncu-decode-kernels-s27.md) — and pass 2 reads the registers, not
// memory. Same operations in the same order per lane as rmsnorm_rope_kernel: the same bits.
constexpr int kNormRopeRegSteps = 16;  // 512 / 32 channels per lane
__global__ void __launch_bounds__(256)
    rmsnorm_rope_regs_kernel(float* x, const float* __restrict__ w, const int64_t* __restrict__ pos,
                             const float* __restrict__ inv_freq, int64_t vecs, int64_t n_heads,
                             int hd, int rd, float eps, float att) {
  const int lane = threadIdx.x & 31;
  const int64_t v = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (v >= vecs) return;  // warp-uniform
  float* xv = x + v * hd;
  const int64_t r = v / n_heads;
  const int steps = (hd + 31) / 32;
  float xs[kNormRopeRegSteps], ws[kNormRopeRegSteps];
#pragma unroll
  for (int k = 0; k < kNormRopeRegSteps; ++k) {
    const int c = lane + 32 * k;
    xs[k] = k < steps && c < hd ? xv[c] : 0.f;
    ws[k] = w && k < steps && c < hd ? w[c] : 1.f;
  }
  const float fpos = float(pos[r]);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kNormRopeRegSteps; ++k)
    if (k < steps) ss += xs[k] * xs[k];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  ss = __shfl_sync(0xffffffffu, ss, 0);
  const float inv = rsqrtf(ss / float(hd) + eps);
  const int r0 = hd - rd;  // first rotated channel (even)
#pragma unroll
  for (int k = 0; k < kNormRopeRegSteps; ++k) {
    if (k >= steps) break;  // warp-uniform
    const int c = lane + 32 * k;
    float y = 0.f;
    if (c < hd) {
      y = xs[k] * inv;
      if (w) y *= ws[k];
    }
    const float partner = __shfl_xor_sync(0xffffffffu, y, 1);  // channel c ^ 1
    if (c >= hd) continue;
    if (c >= r0) {
      const int i = (c - r0) >> 1;
      const float ang = inv_freq[i] * fpos;  // one fp32 product, as rope_kernel
      float sn, cs;
      sincosf(ang, &sn, &cs);
      sn *= att;
      cs *= att;
      y = ((c - r0) & 1) == 0 ? y * cs - partner * sn : partner * sn + y * cs;
    }
    xv[c] = y;
  }
}

}  // namespace

template <typename T>
Status rmsnorm(const T* x, const float* weight, T* out, int64_t rows, int64_t D, float eps,
               cudaStream_t stream) {
  if (D < 1) return errorf(ErrorCode::kInvalidArgument, "rmsnorm: D = {}", D);
  if (rows <= 0) return Status::Ok();
  if (rows > 0x7fffffff) return errorf(ErrorCode::kInvalidArgument, "rmsnorm: {} rows", rows);
  rmsnorm_kernel<T><<<unsigned(rows), 256, 0, stream>>>(x, weight, out, D, eps);
  V4_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
  return Status::Ok();
}

template <typename T>
Status rope_interleaved(T* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                        int64_t n_heads, int64_t head_dim, int64_t rd, int64_t row_stride,
                        bool inverse, cudaStream_t stream, float attention_scaling) {
  if (rd <= 0 || rd > head_dim || rd % 2 || row_stride < n_heads * head_dim)
    return errorf(ErrorCode::kInvalidArgument,
                      "rope: rd={} head_dim={} n_heads={} row_stride={}", rd, head_dim, n_heads,
                      row_stride);
  int64_t total = rows * n_heads * (rd / 2);
  if (total <= 0) return Status::Ok();
  int64_t g = (total + 255) / 256;
  rope_kernel<T><<<unsigned(g > 65536 ? 65536 : g), 256, 0, stream>>>(
      x, pos, inv_freq, rows, n_heads, head_dim, rd, row_stride, inverse, attention_scaling);
  V4_CUDA_CHECK_LAUNCH("rope_kernel");
  return Status::Ok();
}

Status rmsnorm_rope_variant(float* x, const float* weight, const int64_t* pos,
                            const float* inv_freq, int64_t rows, int64_t n_heads, int64_t head_dim,
                            int64_t rd, float eps, float attention_scaling, int variant,
                            cudaStream_t stream) {
  if (rd <= 0 || rd > head_dim || rd % 2 || (head_dim - rd) % 2 || n_heads < 1)
    return errorf(ErrorCode::kInvalidArgument, "rmsnorm_rope: rd={} head_dim={} n_heads={}", rd,
                  head_dim, n_heads);
  if (variant == 2 && head_dim > 32 * kNormRopeRegSteps)
    return errorf(ErrorCode::kInvalidArgument, "rmsnorm_rope: register kernel needs head_dim <= {}",
                  32 * kNormRopeRegSteps);
  const int64_t vecs = rows * n_heads;
  if (vecs <= 0) return Status::Ok();
  const int64_t blocks = (vecs + 7) / 8;
  if (blocks > 0x7fffffff)
    return errorf(ErrorCode::kInvalidArgument, "rmsnorm_rope: {} rows", rows);
  if (variant == 2) {
    rmsnorm_rope_regs_kernel<<<unsigned(blocks), 256, 0, stream>>>(
        x, weight, pos, inv_freq, vecs, n_heads, int(head_dim), int(rd), eps, attention_scaling);
    V4_CUDA_CHECK_LAUNCH("rmsnorm_rope_regs_kernel");
    return Status::Ok();
  }
  rmsnorm_rope_kernel<<<unsigned(blocks), 256, 0, stream>>>(x, weight, pos, inv_freq, vecs, n_heads,
                                                            head_dim, rd, eps, attention_scaling);
  V4_CUDA_CHECK_LAUNCH("rmsnorm_rope_kernel");
  return Status::Ok();
}

Status rmsnorm_rope(float* x, const float* weight, const int64_t* pos, const float* inv_freq,
                    int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rd, float eps,
                    float attention_scaling, cudaStream_t stream) {
  static const bool regs = [] {
    const char* e = std::getenv("V4_NORM_ROPE_REGS");
    return e && e[0] == '1';
  }();
  const int variant = regs && head_dim <= 32 * kNormRopeRegSteps ? 2 : 1;
  return rmsnorm_rope_variant(x, weight, pos, inv_freq, rows, n_heads, head_dim, rd, eps,
                              attention_scaling, variant, stream);
}

template Status rmsnorm<float>(const float*, const float*, float*, int64_t, int64_t, float, cudaStream_t);
template Status rmsnorm<__nv_bfloat16>(const __nv_bfloat16*, const float*, __nv_bfloat16*, int64_t,
                                       int64_t, float, cudaStream_t);
template Status rope_interleaved<float>(float*, const int64_t*, const float*, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, bool, cudaStream_t, float);
template Status rope_interleaved<__nv_bfloat16>(__nv_bfloat16*, const int64_t*, const float*,
                                                int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                                                cudaStream_t, float);

}  // namespace v4::cuda
