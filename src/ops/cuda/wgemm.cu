#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Weight GEMMs over native weight formats (see wgemm.h).
#include <algorithm>
#include <cstdlib>

#include "ops/cuda/dense_mma.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/gemv_stream.h"
#include "ops/cuda/wformat.cuh"
#include "ops/cuda/wgemm.h"

namespace v4::cuda {
namespace {

// ---- fp32 tiled GEMM with dequantization --------------------------------------------------------
// 64×64 output tile per block of 256 threads (4×4 per thread), K in steps of 16 through shared
// memory; the weight tile is dequantized (exact f32) while it is loaded. Each output is one
// sequential FMA chain over k = 0..K−1 → independent of M.
constexpr int kBM = 64, kBN = 64, kBK = 16;

template <WFormat F>
__device__ __forceinline__ float wval_t(const WeightView& w, int64_t e, int64_t n, int64_t kk) {
  const uint8_t* row = wrow(w, e, n);
  if constexpr (F == WFormat::kF32) {
    return reinterpret_cast<const float*>(row)[kk];
  } else if constexpr (F == WFormat::kBF16) {
    return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[kk]) << 16);
  } else if constexpr (F == WFormat::kFP8Block) {
    return e4m3_to_f32(row[kk]) * fp8_scale_row(w, e, n)[kk / 128];
  } else {
    const uint32_t byte = row[kk / 2];
    const uint32_t nib = (kk & 1) ? (byte >> 4) : (byte & 0xfu);
    return e2m1_to_f32(nib) * ue8m0_to_f32(mxfp4_scale_row(w, e, n)[kk / 32]);
  }
}

template <WFormat F>
__global__ void __launch_bounds__(256)
    wgemm_fp32_kernel(const float* __restrict__ x, int64_t ldx, WeightView w, int64_t e, int64_t M,
                      float* __restrict__ y, int64_t ldy) {
  __shared__ float xs[kBK][kBM + 4];
  __shared__ float ws[kBK][kBN + 4];
  const int64_t N = w.n, K = w.k;
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    // 64 rows × 16 k of x and of w: 1024 values each, 4 per thread.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int el = tid + i * 256;
      const int r = el / kBK, c = el % kBK;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + c;
      xs[c][r] = (gm < M && gk < K) ? x[gm * ldx + gk] : 0.f;
      ws[c][r] = (gn < N && gk < K) ? wval_t<F>(w, e, gn, gk) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t gm = m0 + ty + 16 * i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gn = n0 + tx + 16 * j;
      if (gn < N) y[gm * ldy + gn] = acc[i][j];
    }
  }
}

// ---- weight-streaming GEMV
// ----------------------------------------------------------------------- Block = 4 warps. The
// block's warps form 4/ks row groups × ks K-slices. A "chunk" is 32 lanes × V values, V = values
// per 16 bytes of the format (f32 4, bf16 8, FP8 16, MXFP4 32); chunk c goes to K-slice c % ks.
// Each warp computes R = 2 weight rows (2 outputs, or gate+up of one output with SwiGLU) for up to
// MT rows of x: per lane and chunk one 16-byte load per row, unpacked to f32, dotted with x (f32,
// shared memory) as one FMA chain, scaled once per chunk (an FP8 chunk lies in one 128-column
// block, an MXFP4 chunk in one 32-column group), accumulated over the warp's chunks in order; then
// a butterfly over lanes and, with ks > 1, a sum over the K-slices in slice order. All of it
// depends on (N, K, format) only, never on M: a row's result is batch-invariant. x staging: rows of
// x are copied to shared memory in passes of mc rows; within a row, float4 group g is stored at g ^
// ((g >> 3) & (V/4 − 1)) so that the 8 lanes of a quarter-warp reading their V consecutive values
// hit 8 different bank quads (conflict-free 128-bit loads).
constexpr int kGemvThreads = 128, kGemvWarps = 4, kGemvR = 2, kGemvU = 4, kGemvMaxMc = 8;
constexpr size_t kGemvSmemBudget = 96 * 1024;  // x staging per block (2+ blocks per SM)
constexpr size_t kGemvSmemMax = 200 * 1024;

template <WFormat F>
constexpr int kVals = F == WFormat::kF32        ? 4
                      : F == WFormat::kBF16     ? 8
                      : F == WFormat::kFP8Block ? 16
                                                : 32;

inline int vals_per_16b(WFormat f) {
  switch (f) {
    case WFormat::kF32:
      return 4;
    case WFormat::kBF16:
      return 8;
    case WFormat::kFP8Block:
      return 16;
    case WFormat::kMXFP4:
      return 32;
  }
  return 4;
}

template <int V>
__device__ __forceinline__ int64_t xs_index(int64_t kk) {
  constexpr int64_t GL = V / 4;
  const int64_t g = kk >> 2;
  return ((g ^ ((g >> 3) & (GL - 1))) << 2) | (kk & 3);
}

template <WFormat F, bool VEC>
__device__ __forceinline__ uint4 load16(const uint8_t* row, int64_t kk0, int64_t row_bytes) {
  const int64_t off = wrow_bytes(F, kk0);
  if constexpr (VEC) {
    return __ldg(reinterpret_cast<const uint4*>(row + off));
  } else {
    uint32_t v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int b = 0; b < 16; ++b)
      if (off + b < row_bytes) v[b / 4] |= uint32_t(__ldg(row + off + b)) << (8 * (b % 4));
    return make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// 16 stored bytes -> V f32 values (FP8: e4m3 values, unscaled; MXFP4: e2m1·2^-14, unscaled).
template <WFormat F>
__device__ __forceinline__ void unpack16(const uint4& q, float* f) {
  const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (F == WFormat::kF32) {
      f[i] = __uint_as_float(u[i]);
    } else if constexpr (F == WFormat::kBF16) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else if constexpr (F == WFormat::kFP8Block) {
      const float2 a = e4m3x2_to_f32(u[i] & 0xffffu), b = e4m3x2_to_f32(u[i] >> 16);
      f[4 * i] = a.x;
      f[4 * i + 1] = a.y;
      f[4 * i + 2] = b.x;
      f[4 * i + 3] = b.y;
    } else {
      e2m1x8_to_f32_2m14(u[i], f + 8 * i);
    }
  }
}

template <WFormat F, bool VEC, int MT, bool SWIGLU>
__global__ void __launch_bounds__(kGemvThreads) wgemv_kernel(GemvArgs a) {
  extern __shared__ float4 gemv_smem[];
  float* xs = reinterpret_cast<float*>(gemv_smem);
  constexpr int V = kVals<F>;
  constexpr int R = kGemvR, U = kGemvU;
  constexpr int OPW = SWIGLU ? 1 : R;  // outputs per warp
  const WeightView& w = a.w;
  const int64_t K = w.k;
  const int64_t nchunks = (K + 32 * V - 1) / (32 * V);
  const int64_t Ks = nchunks * 32 * V;
  float* red = xs + int64_t(a.mc) * Ks;  // [warps][R][MT]
  int64_t e = 0, rbeg = 0, rcnt = a.rows;
  const int64_t grp = a.list ? 0 : blockIdx.y;  // grouped plain form (GemvArgs)
  const float* const X = a.x + grp * a.x_group_stride;
  float* const Y = a.y + grp * a.y_group_stride;
  const int64_t nb = grp * a.n_out;
  if (a.list) {
    if (int(blockIdx.y) >= *a.active_count) return;
    e = a.active[blockIdx.y];
    rbeg = a.offset[e];
    rcnt = a.offset[e + 1] - rbeg;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ks = a.ks, groups = kGemvWarps / ks;
  const int kslice = warp % ks, group = warp / ks;
  const int64_t per_tile = int64_t(groups) * OPW;
  const int64_t ntiles = (a.n_out + per_tile - 1) / per_tile;
  const int64_t rbytes = wrow_bytes(F, K);

  // The first tile's weight bytes are requested into L2 before x is staged, so the two memory
  // latencies overlap (most small GEMVs give a block a single tile: its whole weight slice).
  if (rcnt > 0 && int64_t(blockIdx.x) < ntiles) {
    const int64_t o0 = int64_t(blockIdx.x) * per_tile + int64_t(group) * OPW;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t out = SWIGLU ? o0 : o0 + r;
      if (out >= a.n_out) continue;
      const uint8_t* row = wrow(w, e, nb + (SWIGLU ? o0 + r * a.n_out : o0 + r));
      for (int64_t c = kslice; c < nchunks; c += ks) {
        const int64_t kk0 = c * 32 * V + int64_t(lane) * V;
        if (kk0 < K)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(row + wrow_bytes(F, kk0)));
      }
    }
  }

  for (int64_t m0 = 0; m0 < rcnt; m0 += a.mc) {
    const int mc = int(rcnt - m0 < a.mc ? rcnt - m0 : a.mc);
    __syncthreads();  // the previous pass is done with xs
    // float4 loads when every x row is 16-byte aligned (the loads of a thread are independent, so
    // they are all in flight together); a swizzle moves whole float4 groups.
    const bool x4 =
        (K & 3) == 0 && (a.ldx & 3) == 0 && (reinterpret_cast<uintptr_t>(a.x) & 15) == 0;
    for (int i = 0; i < mc; ++i) {
      const int64_t item = rbeg + m0 + i;
      const int64_t xr = a.list ? int64_t(a.list[item] / a.xdiv) : item;
      const float* src = X + xr * a.ldx;
      float* dst = xs + int64_t(i) * Ks;
      if (x4) {
        const int64_t G = Ks / 4, GK = K / 4;
#pragma unroll 8
        for (int64_t g = threadIdx.x; g < G; g += kGemvThreads) {
          const float4 v = g < GK ? __ldg(reinterpret_cast<const float4*>(src) + g)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
          *reinterpret_cast<float4*>(dst + xs_index<V>(4 * g)) = v;
        }
      } else {
        for (int64_t kk = threadIdx.x; kk < Ks; kk += kGemvThreads)
          dst[xs_index<V>(kk)] = kk < K ? src[kk] : 0.f;
      }
    }
    __syncthreads();

    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const int64_t o0 = tile * per_tile + int64_t(group) * OPW;  // first output of this warp
      const uint8_t* rowp[R];
      const void* scp[R];
      bool rok[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t out = SWIGLU ? o0 : o0 + r;
        rok[r] = out < a.n_out;
        const int64_t n = nb + (rok[r] ? (SWIGLU ? o0 + r * a.n_out : o0 + r) : 0);
        rowp[r] = wrow(w, e, n);
        if constexpr (F == WFormat::kFP8Block)
          scp[r] = fp8_scale_row(w, e, n);
        else if constexpr (F == WFormat::kMXFP4)
          scp[r] = mxfp4_scale_row(w, e, n);
        else
          scp[r] = nullptr;
      }
      float acc[R][MT];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

      for (int64_t c0 = kslice; c0 < nchunks; c0 += int64_t(ks) * U) {
        uint4 q[R][U];
        float sc[R][U];
        // Issue all loads of the batch first (R·U 16-byte loads in flight per lane).
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = c0 + int64_t(u) * ks;
          const int64_t kk0 = c * 32 * V + int64_t(lane) * V;
          const bool in = c < nchunks && kk0 < K;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            q[r][u] = make_uint4(0u, 0u, 0u, 0u);
            sc[r][u] = 1.f;
            if (in && rok[r]) {
              q[r][u] = load16<F, VEC>(rowp[r], kk0, rbytes);
              if constexpr (F == WFormat::kFP8Block)
                sc[r][u] = __ldg(static_cast<const float*>(scp[r]) + kk0 / 128);
              else if constexpr (F == WFormat::kMXFP4)
                sc[r][u] = ue8m0_to_f32(__ldg(static_cast<const uint8_t*>(scp[r]) + kk0 / 32));
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = c0 + int64_t(u) * ks;
          const int64_t kk0 = c * 32 * V + int64_t(lane) * V;
          if (c >= nchunks || kk0 >= K) continue;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (!rok[r]) continue;
            float wf[V];
            unpack16<F>(q[r][u], wf);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              if (m < mc) {
                const float* xm = xs + int64_t(m) * Ks;
                float p = 0.f;
#pragma unroll
                for (int g4 = 0; g4 < V / 4; ++g4) {
                  const float4 xv =
                      *reinterpret_cast<const float4*>(xm + xs_index<V>(kk0 + 4 * g4));
                  p = fmaf(xv.x, wf[4 * g4], p);
                  p = fmaf(xv.y, wf[4 * g4 + 1], p);
                  p = fmaf(xv.z, wf[4 * g4 + 2], p);
                  p = fmaf(xv.w, wf[4 * g4 + 3], p);
                }
                if constexpr (F == WFormat::kF32 || F == WFormat::kBF16)
                  acc[r][m] += p;
                else if constexpr (F == WFormat::kFP8Block)
                  acc[r][m] = fmaf(p, sc[r][u], acc[r][m]);
                else  // e2m1 values carried 2^-14 (exact): restore before the group scale
                  acc[r][m] = fmaf(p * 16384.f, sc[r][u], acc[r][m]);
              }
            }
          }
        }
      }
      // Lane butterfly (every lane ends with the same sum: a + b == b + a).
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float v = acc[r][m];
#pragma unroll
          for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
          acc[r][m] = v;
        }
      bool writer = lane == 0;
      if (ks > 1) {
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) red[(warp * R + r) * MT + m] = acc[r][m];
        }
        __syncthreads();
        writer = lane == 0 && kslice == 0;
        if (writer) {
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              float t = red[((group * ks) * R + r) * MT + m];
              for (int s = 1; s < ks; ++s) t += red[((group * ks + s) * R + r) * MT + m];
              acc[r][m] = t;
            }
        }
        __syncthreads();  // red is reused by the next tile
      }
      if (writer) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m >= mc) continue;
          const int64_t item = rbeg + m0 + m;
          const int64_t yr = a.list ? int64_t(a.list[item]) : item;
          float* yrow = Y + yr * a.ldy;
          if constexpr (SWIGLU) {
            if (o0 < a.n_out) {
              float g = acc[0][m], u = acc[1][m];
              if (a.limit > 0.f) {
                g = fminf(g, a.limit);
                u = fminf(fmaxf(u, -a.limit), a.limit);
              }
              yrow[o0] = g / (1.f + expf(-g)) * u;
            }
          } else {
#pragma unroll
            for (int r = 0; r < R; ++r)
              if (o0 + r < a.n_out) yrow[o0 + r] = acc[r][m];
          }
        }
      }
    }
  }
}

template <WFormat F, bool VEC, int MT, bool SWIGLU>
Status launch_gemv(const GemvArgs& a, dim3 grid, size_t smem, cudaStream_t stream) {
  wgemv_kernel<F, VEC, MT, SWIGLU><<<grid, kGemvThreads, smem, stream>>>(a);
  return check_launch("wgemv_kernel");
}

// Opt every GEMV instantiation in to kGemvSmemMax of dynamic shared memory (once, at backend
// creation: no attribute call later, e.g. inside a CUDA graph capture).
template <WFormat F, bool VEC, int MT>
Status prepare_mt() {
  V4_CUDA_TRY(cudaFuncSetAttribute(wgemv_kernel<F, VEC, MT, false>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGemvSmemMax)));
  V4_CUDA_TRY(cudaFuncSetAttribute(wgemv_kernel<F, VEC, MT, true>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, int(kGemvSmemMax)));
  return Status::Ok();
}
template <WFormat F, bool VEC>
Status prepare_format() {
  V4_RETURN_IF_ERROR((prepare_mt<F, VEC, 1>()));
  V4_RETURN_IF_ERROR((prepare_mt<F, VEC, 2>()));
  return prepare_mt<F, VEC, kGemvMaxMc>();
}

// Rows per shared-memory pass as a template (1, 2 or kGemvMaxMc): fewer unrolled accumulators
// and less x staging (more blocks per SM) when the rows per item are few (decode).
template <WFormat F, bool VEC>
Status dispatch_mt(const GemvArgs& a, int mt, dim3 grid, size_t smem, cudaStream_t stream) {
  if (mt == 1)
    return a.swiglu ? launch_gemv<F, VEC, 1, true>(a, grid, smem, stream)
                    : launch_gemv<F, VEC, 1, false>(a, grid, smem, stream);
  if (mt == 2)
    return a.swiglu ? launch_gemv<F, VEC, 2, true>(a, grid, smem, stream)
                    : launch_gemv<F, VEC, 2, false>(a, grid, smem, stream);
  return a.swiglu ? launch_gemv<F, VEC, kGemvMaxMc, true>(a, grid, smem, stream)
                  : launch_gemv<F, VEC, kGemvMaxMc, false>(a, grid, smem, stream);
}

// Resident blocks per SM the grid aims for (V4_GEMV_BLOCKS_PER_SM, default 4): more blocks keep
// more weight loads in flight (the GEMV is latency-bound at small M).
int gemv_blocks_per_sm() {
  static const int v = [] {
    const char* e = std::getenv("V4_GEMV_BLOCKS_PER_SM");
    const int n = e ? std::atoi(e) : 0;
    return n > 0 ? n : 4;
  }();
  return v;
}

// ---- bf16 operands for the tensor-core path ---------------------------------------------------
__global__ void dequant_view_bf16_kernel(WeightView w, int64_t e, __nv_bfloat16* __restrict__ out) {
  const int64_t total = w.n * w.k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / w.k, kk = i - n * w.k;
    out[i] = __float2bfloat16_rn(wval(w, e, n, kk));
  }
}

// The vector form of dequant_view_bf16_kernel (FP8 block / MXFP4, k % 16 == 0, 16-byte aligned
// rows and output): one thread per 16 consecutive values of a row — one 16-byte (FP8) or 8-byte
// (MXFP4) load, one scale, two 16-byte stores. Each value is the scalar kernel's (wval: the code's
// exact f32 value times the f32 block scale, one multiply, then round-to-nearest bf16), so both
// give the same bits. The scalar kernel moved ~0.6 TB/s (one byte load and a 64-bit division per
// value; 154 µs for V4-Flash's 32 MiB wq_b at a 2,048-token prefill step, ncu-kernels.md).
template <WFormat F>
__global__ void dequant_view_bf16_vec_kernel(WeightView w, int64_t e,
                                             __nv_bfloat16* __restrict__ out) {
  const int64_t kg = w.k / 16, total = w.n * kg;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < total;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = g / kg, k0 = (g - n * kg) * 16;
    const uint8_t* row = wrow(w, e, n);
    float v[16];
    if constexpr (F == WFormat::kFP8Block) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(row + k0));
      const float sc = __ldg(fp8_scale_row(w, e, n) + k0 / 128);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 lo = e4m3x2_to_f32(words[i] & 0xffffu), hi = e4m3x2_to_f32(words[i] >> 16);
        v[4 * i] = lo.x * sc;
        v[4 * i + 1] = lo.y * sc;
        v[4 * i + 2] = hi.x * sc;
        v[4 * i + 3] = hi.y * sc;
      }
    } else {
      const uint2 q = __ldg(reinterpret_cast<const uint2*>(row + k0 / 2));
      const float sc = ue8m0_to_f32(__ldg(mxfp4_scale_row(w, e, n) + k0 / 32));
      const uint32_t words[2] = {q.x, q.y};
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) v[8 * i + j] = e2m1_to_f32((words[i] >> (4 * j)) & 0xfu) * sc;
    }
    uint4 o[2];
    uint32_t* ow = reinterpret_cast<uint32_t*>(o);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
      ow[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + n * w.k + k0);
    dst[0] = o[0];
    dst[1] = o[1];
  }
}

// The vector form of rows_to_bf16_kernel (K % 8 == 0, ldx % 4 == 0, 16-byte aligned x and out):
// one thread per 8 consecutive values of a row, two float4 loads and one 16-byte store; the same
// round-to-nearest as the scalar kernel (same bits). The scalar kernel moved ~2 TB/s.
__global__ void rows_to_bf16_vec_kernel(const float* __restrict__ x, int64_t ldx, int64_t M,
                                        int64_t K, __nv_bfloat16* __restrict__ out) {
  const int64_t kg = K / 8, total = M * kg;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < total;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = g / kg, k0 = (g - m * kg) * 8;
    const float4* src = reinterpret_cast<const float4*>(x + m * ldx + k0);
    const float4 a = __ldg(src), b = __ldg(src + 1);
    const __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y), p1 = __floats2bfloat162_rn(a.z, a.w),
                         p2 = __floats2bfloat162_rn(b.x, b.y), p3 = __floats2bfloat162_rn(b.z, b.w);
    uint4 o;
    o.x = *reinterpret_cast<const uint32_t*>(&p0);
    o.y = *reinterpret_cast<const uint32_t*>(&p1);
    o.z = *reinterpret_cast<const uint32_t*>(&p2);
    o.w = *reinterpret_cast<const uint32_t*>(&p3);
    *reinterpret_cast<uint4*>(out + m * K + k0) = o;
  }
}

__global__ void rows_to_bf16_kernel(const float* __restrict__ x, int64_t ldx, int64_t M, int64_t K,
                                    __nv_bfloat16* __restrict__ out) {
  const int64_t total = M * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / K, kk = i - m * K;
    out[i] = __float2bfloat16_rn(x[m * ldx + kk]);
  }
}

Status check_view(const WeightView& w, const char* what) {
  if (!w.data || w.n < 0 || w.k <= 0 || w.rows_total < w.row0 + w.n ||
      (w.format == WFormat::kMXFP4 && w.k % 32) ||
      ((w.format == WFormat::kFP8Block || w.format == WFormat::kMXFP4) && !w.scale))
    return errorf(ErrorCode::kInvalidArgument,
                  "{}: bad weight view ({} n={} k={} row0={} rows_total={})", what,
                  ops::wformat_name(w.format), w.n, w.k, w.row0, w.rows_total);
  return Status::Ok();
}

}  // namespace

Status wgemm_fp32(const float* x, int64_t ldx, const WeightView& w, int64_t e, int64_t M, float* y,
                  int64_t ldy, cudaStream_t stream) {
  if (M <= 0 || w.n <= 0) return Status::Ok();
  V4_RETURN_IF_ERROR(check_view(w, "wgemm_fp32"));
  dim3 grid(unsigned((w.n + kBN - 1) / kBN), unsigned((M + kBM - 1) / kBM));
  switch (w.format) {
    case WFormat::kF32:
      wgemm_fp32_kernel<WFormat::kF32><<<grid, 256, 0, stream>>>(x, ldx, w, e, M, y, ldy);
      break;
    case WFormat::kBF16:
      wgemm_fp32_kernel<WFormat::kBF16><<<grid, 256, 0, stream>>>(x, ldx, w, e, M, y, ldy);
      break;
    case WFormat::kFP8Block:
      wgemm_fp32_kernel<WFormat::kFP8Block><<<grid, 256, 0, stream>>>(x, ldx, w, e, M, y, ldy);
      break;
    case WFormat::kMXFP4:
      wgemm_fp32_kernel<WFormat::kMXFP4><<<grid, 256, 0, stream>>>(x, ldx, w, e, M, y, ldy);
      break;
  }
  return check_launch("wgemm_fp32_kernel");
}

Status wgemv_prepare() {
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kF32, true>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kF32, false>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kBF16, true>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kBF16, false>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kFP8Block, true>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kFP8Block, false>()));
  V4_RETURN_IF_ERROR((prepare_format<WFormat::kMXFP4, true>()));
  return Status::Ok();
}

bool wgemv_supported(const WeightView& w) {
  const int V = vals_per_16b(w.format);
  const int64_t Ks = (w.k + 32 * V - 1) / (32 * V) * (32 * V);
  if (size_t(Ks) * 4 + 1024 > kGemvSmemMax) return false;
  if (w.format == WFormat::kMXFP4 && (w.k % 32 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0))
    return false;
  return true;
}

Status wgemv(GemvArgs a, int grid_y, int num_sms, cudaStream_t stream) {
  const WeightView& w = a.w;
  if (a.n_out <= 0 || (!a.list && a.rows <= 0) || grid_y <= 0) return Status::Ok();
  V4_RETURN_IF_ERROR(check_view(w, "wgemv"));
  if (a.use_stream_kernel && gemv_stream_env_enabled() && gemv_stream_supported(a))
    return gemv_stream(a, grid_y, num_sms, stream);
  if (!wgemv_supported(w))
    return errorf(ErrorCode::kUnsupported, "wgemv: {} view k={} not supported",
                  ops::wformat_name(w.format), w.k);
  const int V = vals_per_16b(w.format);
  const int64_t nchunks = (w.k + 32 * V - 1) / (32 * V);
  const int64_t Ks = nchunks * 32 * V;
  const bool vec =
      wrow_bytes(w.format, w.k) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  const int opw = a.swiglu ? 1 : kGemvR;
  const int64_t warps1 = (a.n_out + opw - 1) / opw;
  int ks = warps1 >= 8 * int64_t(num_sms) ? 1 : warps1 >= 4 * int64_t(num_sms) ? 2 : 4;
  while (ks > 1 && ks > nchunks) ks /= 2;
  int64_t mc = wgemv_pass_rows(w);
  const int64_t rows_per_item = a.list ? (a.rows_hint > 0 ? a.rows_hint : kGemvMaxMc) : a.rows;
  const int mt = rows_per_item <= 1 ? 1 : rows_per_item <= 2 ? 2 : kGemvMaxMc;
  mc = std::min<int64_t>({mc, int64_t(mt), a.list ? int64_t(mt) : a.rows});
  a.ks = ks;
  a.mc = int(mc);
  const size_t smem = size_t(mc * Ks) * 4 + size_t(kGemvWarps * kGemvR * mt) * 4;
  const int64_t per_tile = int64_t(kGemvWarps / ks) * opw;
  const int64_t ntiles = (a.n_out + per_tile - 1) / per_tile;
  const int64_t gx = std::min<int64_t>(
      ntiles,
      std::max<int64_t>(1, (gemv_blocks_per_sm() * int64_t(num_sms) + grid_y - 1) / grid_y));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(grid_y));
  switch (w.format) {
    case WFormat::kF32:
      return vec ? dispatch_mt<WFormat::kF32, true>(a, mt, grid, smem, stream)
                 : dispatch_mt<WFormat::kF32, false>(a, mt, grid, smem, stream);
    case WFormat::kBF16:
      return vec ? dispatch_mt<WFormat::kBF16, true>(a, mt, grid, smem, stream)
                 : dispatch_mt<WFormat::kBF16, false>(a, mt, grid, smem, stream);
    case WFormat::kFP8Block:
      return vec ? dispatch_mt<WFormat::kFP8Block, true>(a, mt, grid, smem, stream)
                 : dispatch_mt<WFormat::kFP8Block, false>(a, mt, grid, smem, stream);
    case WFormat::kMXFP4:
      return dispatch_mt<WFormat::kMXFP4, true>(a, mt, grid, smem, stream);
  }
  return Status::Ok();
}

// V4_DEQUANT_VEC=0: the scalar conversion kernels (A/B runs and the tests' cross-check).
bool dequant_vec_enabled() {
  const char* v = std::getenv("V4_DEQUANT_VEC");
  return !(v && v[0] == '0');
}

Status dequant_view_bf16(const WeightView& w, int64_t e, __nv_bfloat16* out, cudaStream_t stream) {
  if (w.n <= 0) return Status::Ok();
  V4_RETURN_IF_ERROR(check_view(w, "dequant_view_bf16"));
  const bool vec = (w.format == WFormat::kFP8Block || w.format == WFormat::kMXFP4) &&
                   w.k % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0 && dequant_vec_enabled();
  if (vec) {
    const int64_t groups = w.n * (w.k / 16);
    if (w.format == WFormat::kFP8Block)
      dequant_view_bf16_vec_kernel<WFormat::kFP8Block>
          <<<grid_for(groups, 256), 256, 0, stream>>>(w, e, out);
    else
      dequant_view_bf16_vec_kernel<WFormat::kMXFP4>
          <<<grid_for(groups, 256), 256, 0, stream>>>(w, e, out);
    return check_launch("dequant_view_bf16_vec_kernel");
  }
  dequant_view_bf16_kernel<<<grid_for(w.n * w.k, 256), 256, 0, stream>>>(w, e, out);
  return check_launch("dequant_view_bf16_kernel");
}

Status rows_to_bf16(const float* x, int64_t ldx, int64_t M, int64_t K, __nv_bfloat16* out,
                    cudaStream_t stream) {
  if (M <= 0 || K <= 0) return Status::Ok();
  if (K % 8 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0 && dequant_vec_enabled()) {
    rows_to_bf16_vec_kernel<<<grid_for(M * (K / 8), 256), 256, 0, stream>>>(x, ldx, M, K, out);
    return check_launch("rows_to_bf16_vec_kernel");
  }
  rows_to_bf16_kernel<<<grid_for(M * K, 256), 256, 0, stream>>>(x, ldx, M, K, out);
  return check_launch("rows_to_bf16_kernel");
}

}  // namespace v4::cuda

namespace v4::cuda {

int64_t wgemv_pass_rows(const WeightView& w) {
  const int V = vals_per_16b(w.format);
  const int64_t Ks = (w.k + 32 * V - 1) / (32 * V) * (32 * V);
  return std::clamp<int64_t>(int64_t(kGemvSmemBudget / (size_t(Ks) * 4)), 1, kGemvMaxMc);
}

bool linear_bf16_uses_gemv(const WeightView& w, int64_t M, int64_t gemv_max_rows) {
  // f32 weights (the MoE router, small f32 matrices) have no tensor-core path: the GEMV up to
  // kF32GemvMaxRows (one weight pass per 8 rows), then cuBLASLt in fp32 (linear_w_bf16).
  if (w.format == WFormat::kF32) gemv_max_rows = std::max<int64_t>(gemv_max_rows, kF32GemvMaxRows);
  if (M > gemv_max_rows || !wgemv_supported(w)) return false;
  return w.format != WFormat::kBF16 || M <= wgemv_pass_rows(w);
}

void linear_scratch_bytes(int64_t M, int64_t n, int64_t K, bool bf16_weight, const KernelContext& c,
                          size_t* bytes) {
  if (M <= c.gemv_max_rows && !bf16_weight) return;  // GEMV (or the fp32 fallback): no scratch
  if (!bf16_weight && c.dense_mma && M <= kDenseMmaMaxRows)
    dense_mma_scratch_bytes(M, n, K, c.num_sms, bytes);
  bytes[kSlotXBf16] = std::max(bytes[kSlotXBf16], size_t(M * K) * 2);
  if (!bf16_weight) bytes[kSlotWBf16] = std::max(bytes[kSlotWBf16], size_t(n * K) * 2);
}

// Plain-form GEMV arguments: M rows of x against expert 0 of w, n_out outputs per row.
static GemvArgs plain_gemv_args(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                         int64_t ldy, int64_t n_out) {
  GemvArgs a;
  a.w = w;
  a.w.experts = 1;
  a.x = x;
  a.ldx = ldx;
  a.y = y;
  a.ldy = ldy;
  a.rows = M;
  a.n_out = n_out;
  return a;
}

// V4_GROUPED_BATCHED=0: linear_w_grouped_bf16 runs the groups one by one above the GEMV range
// (A/B runs; read once).
static bool batched_grouped_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("V4_GROUPED_BATCHED");
    return !(e && e[0] == '0');
  }();
  return on;
}

Status linear_w_grouped_bf16(const float* x, int64_t ldx, const WeightView& w, int groups,
                             int64_t M, float* y, int64_t ldy, const KernelContext& c) {
  if (M <= 0 || w.n <= 0) return Status::Ok();
  if (groups < 1 || w.n % groups)
    return errorf(ErrorCode::kInvalidArgument, "linear_w_grouped: {} rows into {} groups", w.n,
                  groups);
  const int64_t n = w.n / groups;
  if (linear_bf16_uses_gemv(w.rows(0, n), M, c.gemv_max_rows)) {
    GemvArgs a = plain_gemv_args(x, ldx, w, M, y, ldy, n);
    a.use_stream_kernel = c.gemv_stream;
    a.x_group_stride = w.k;
    a.y_group_stride = n;
    return wgemv(a, groups, c.num_sms, c.stream);
  }
  // Above the GEMV and dense_mma ranges every group would take linear_w_bf16's cuBLASLt path
  // (x to bf16, the group's weights dequantized, one GEMM): do it once for all groups — one
  // conversion of the groups' x columns, one dequantization of the whole view, one strided-batch
  // GEMM — instead of three launches a group (V4-Flash wo_a: 8 GEMMs of 1,024 outputs each, a
  // wave or less of CTAs apiece).
  const WeightView w0 = w.rows(0, n);
  const bool cublas_path = groups > 1 && c.gemm && w.experts <= 1 &&
                           (w.format == WFormat::kBF16 || w.format == WFormat::kFP8Block ||
                            w.format == WFormat::kMXFP4) &&
                           M > c.gemv_max_rows &&
                           !(c.dense_mma && dense_mma_supported(w0, x, ldx, M)) &&
                           !(c.fused_tc && wmma_gemm_supported(w0, x, ldx)) &&
                           batched_grouped_enabled();
  if (cublas_path) {
    const int64_t kx = int64_t(groups) * w.k;  // the groups' x columns, contiguous in a row
    auto* xb = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, size_t(M * kx) * 2));
    V4_RETURN_IF_ERROR(rows_to_bf16(x, ldx, M, kx, xb, c.stream));
    const __nv_bfloat16* wb = nullptr;
    if (w.format == WFormat::kBF16) {
      wb = reinterpret_cast<const __nv_bfloat16*>(wrow(w, 0, 0));
    } else {
      auto* d = static_cast<__nv_bfloat16*>(c.get(kSlotWBf16, size_t(w.n * w.k) * 2));
      V4_RETURN_IF_ERROR(dequant_view_bf16(w, 0, d, c.stream));
      wb = d;
    }
    return c.gemm->bf16_strided_batched(xb, kx, w.k, wb, w.k, n * w.k, y, ldy, n, OutType::kF32,
                                        M, n, w.k, groups, c.stream);
  }
  for (int g = 0; g < groups; ++g)
    V4_RETURN_IF_ERROR(linear_w_bf16(x + int64_t(g) * w.k, ldx, w.rows(int64_t(g) * n, n), M,
                                     y + int64_t(g) * n, ldy, c));
  return Status::Ok();
}

Status linear_w_bf16(const float* x, int64_t ldx, const WeightView& w, int64_t M, float* y,
                     int64_t ldy, const KernelContext& c) {
  if (M <= 0 || w.n <= 0) return Status::Ok();
  if (linear_bf16_uses_gemv(w, M, c.gemv_max_rows)) {
    GemvArgs a = plain_gemv_args(x, ldx, w, M, y, ldy, w.n);
    a.use_stream_kernel = c.gemv_stream;
    return wgemv(a, 1, c.num_sms, c.stream);
  }
  if (w.format == WFormat::kF32 && c.gemm && w.experts <= 1 &&
      reinterpret_cast<uintptr_t>(w.data) % 4 == 0)  // above the GEMV range: fp32 cuBLASLt
    return c.gemm->f32_strided(x, ldx, reinterpret_cast<const float*>(wrow(w, 0, 0)), w.k, y,
                               ldy, M, w.n, w.k, c.stream);
  if (w.format == WFormat::kF32 || (M <= c.gemv_max_rows && w.format != WFormat::kBF16))
    return wgemm_fp32(x, ldx, w, 0, M, y, ldy, c.stream);  // (exotic views wgemv cannot run)
  if (c.dense_mma && dense_mma_supported(w, x, ldx, M))
    return dense_mma(x, ldx, w, M, y, ldy, c);
  if (c.fused_tc && wmma_gemm_supported(w, x, ldx))
    return wmma_gemm(plain_gemv_args(x, ldx, w, M, y, ldy, w.n), 1, c.num_sms, c.stream);
  size_t need[kNumScratchSlots] = {};
  linear_scratch_bytes(M, w.n, w.k, w.format == WFormat::kBF16, c, need);
  auto* xb = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, need[kSlotXBf16]));
  V4_RETURN_IF_ERROR(rows_to_bf16(x, ldx, M, w.k, xb, c.stream));
  const __nv_bfloat16* wb = nullptr;
  if (w.format == WFormat::kBF16) {
    wb = reinterpret_cast<const __nv_bfloat16*>(wrow(w, 0, 0));
  } else {
    auto* d = static_cast<__nv_bfloat16*>(c.get(kSlotWBf16, need[kSlotWBf16]));
    V4_RETURN_IF_ERROR(dequant_view_bf16(w, 0, d, c.stream));
    wb = d;
  }
  return c.gemm->bf16_strided(xb, w.k, wb, w.k, y, ldy, OutType::kF32, M, w.n, w.k, c.stream);
}

}  // namespace v4::cuda
