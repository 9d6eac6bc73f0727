#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// Fused tensor-core GEMM over native weight bytes (bf16 precision mode, see wgemm.h wmma_gemm):
// a CTA of 4 warps computes a 64 (rows of x) × 64 (weight rows) tile; per 64-column K step the
// x tile is converted f32 → bf16 and the weight tile is read with 16-byte loads in its stored
// format and dequantized to bf16 (exact for bf16, ue8m0-scaled FP8 and MXFP4) into shared memory;
// each warp multiplies a 32 × 32 sub-tile with WMMA bf16 16×16×16 fragments, fp32 accumulation.
// Plain form: grid (M tiles, N tiles), M tiles fastest so CTAs sharing a weight tile run
// together (L2). Grouped form (MoE): grid (N tiles, active-expert slots); a CTA loops over its
// expert's 64-row tiles of x, rows gathered through the pair list. SwiGLU form: a tile's weight
// rows are 32 gate rows and the 32 matching up rows, the epilogue writes 32 activations.
#include <mma.h>

#include <algorithm>

#include "ops/cuda/device_util.cuh"
#include "ops/cuda/wformat.cuh"
#include "ops/cuda/wgemm.h"

namespace v4::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTM = 64, kTN = 64, kTK = 64, kLdab = kTK + 8, kLdc = kTN + 4;
constexpr int kThreads = 128;

template <WFormat F>
constexpr int kVals16 = F == WFormat::kBF16       ? 8
                        : F == WFormat::kFP8Block ? 16
                                                  : 32;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float swiglu_act(float g, float u, float lim) {
  if (lim > 0.f) {
    g = fminf(g, lim);
    u = fminf(fmaxf(u, -lim), lim);
  }
  return g / (1.f + expf(-g)) * u;
}

template <WFormat F, bool SWIGLU>
__global__ void __launch_bounds__(kThreads) wmma_gemm_kernel(GemvArgs a) {
  // As [64][72] bf16 and Bs [64][72] bf16 during the K loop; Cs [64][68] f32 in the epilogue.
  __shared__ __align__(128) unsigned char smem[2 * kTM * kLdab * 2];
  static_assert(kTM * kLdc * 4 <= 2 * kTM * kLdab * 2, "epilogue tile fits the operand tiles");
  __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Bs = As + kTM * kLdab;
  float* Cs = reinterpret_cast<float*>(smem);
  constexpr int V = kVals16<F>;
  constexpr int kChunksPerRow = kTK / V;               // 16-byte chunks of a 64-column weight row
  constexpr int kOutPerTile = SWIGLU ? kTN / 2 : kTN;  // outputs per tile

  const WeightView& w = a.w;
  const int64_t K = w.k;
  int64_t e = 0, rbeg = 0, rcnt = a.rows;
  int64_t t_begin, t_step, m_begin, m_step;
  const int64_t ntiles = (a.n_out + kOutPerTile - 1) / kOutPerTile;
  if (a.list) {
    if (int(blockIdx.y) >= *a.active_count) return;
    e = a.active[blockIdx.y];
    rbeg = a.offset[e];
    rcnt = a.offset[e + 1] - rbeg;
    t_begin = blockIdx.x;
    t_step = gridDim.x;
    m_begin = 0;
    m_step = kTM;
  } else {
    t_begin = blockIdx.y;
    t_step = ntiles;
    m_begin = int64_t(blockIdx.x) * kTM;
    m_step = rcnt + kTM;  // one M tile per CTA
  }
  const int tid = threadIdx.x, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;  // 2 × 2 warps, 32 × 32 each

  for (int64_t tile = t_begin; tile < ntiles; tile += t_step) {
    const int64_t o0 = tile * kOutPerTile;
    for (int64_t m0 = m_begin; m0 < rcnt; m0 += m_step) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

      // x rows of this thread's share of the tile: row xr_t (2 threads per row, 32 columns each)
      const int xrow = tid >> 1, xcol = (tid & 1) * 32;
      const float* xsrc = nullptr;
      if (m0 + xrow < rcnt) {
        const int64_t item = rbeg + m0 + xrow;
        const int64_t r = a.list ? int64_t(a.list[item] / a.xdiv) : item;
        xsrc = a.x + r * a.ldx;
      }

      for (int64_t k0 = 0; k0 < K; k0 += kTK) {
        // x tile: f32 -> bf16
        {
          uint4* dst = reinterpret_cast<uint4*>(As + xrow * kLdab + xcol);
#pragma unroll
          for (int q = 0; q < 4; ++q) {  // 8 values per 16-byte store
            float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
            if (xsrc) {
              v0 = __ldg(reinterpret_cast<const float4*>(xsrc + k0 + xcol + 8 * q));
              v1 = __ldg(reinterpret_cast<const float4*>(xsrc + k0 + xcol + 8 * q + 4));
            }
            dst[q] = make_uint4(pack_bf16x2(v0.x, v0.y), pack_bf16x2(v0.z, v0.w),
                                pack_bf16x2(v1.x, v1.y), pack_bf16x2(v1.z, v1.w));
          }
        }
        // weight tile: native 16-byte chunks -> bf16
        for (int ch = tid; ch < kTN * kChunksPerRow; ch += kThreads) {
          const int r = ch / kChunksPerRow, c0 = (ch % kChunksPerRow) * V;
          const int64_t out = SWIGLU ? o0 + (r % (kTN / 2)) : o0 + r;
          uint32_t packed[V / 2];
          if (out < a.n_out) {
            const int64_t n = SWIGLU ? (r < kTN / 2 ? out : a.n_out + out) : out;
            const uint8_t* row = wrow(w, e, n);
            const int64_t kk = k0 + c0;
            const uint4 q = __ldg(reinterpret_cast<const uint4*>(row + wrow_bytes(F, kk)));
            const uint32_t u[4] = {q.x, q.y, q.z, q.w};
            if constexpr (F == WFormat::kBF16) {
#pragma unroll
              for (int i = 0; i < 4; ++i) packed[i] = u[i];  // already bf16 pairs
            } else if constexpr (F == WFormat::kFP8Block) {
              const float s = __ldg(fp8_scale_row(w, e, n) + kk / 128);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const float2 lo = e4m3x2_to_f32(u[i] & 0xffffu), hi = e4m3x2_to_f32(u[i] >> 16);
                packed[2 * i] = pack_bf16x2(lo.x * s, lo.y * s);
                packed[2 * i + 1] = pack_bf16x2(hi.x * s, hi.y * s);
              }
            } else {
              const float s = ue8m0_to_f32(__ldg(mxfp4_scale_row(w, e, n) + kk / 32));
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                float f[8];
                e2m1x8_to_f32_2m14(u[i], f);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                  packed[4 * i + j] =
                      pack_bf16x2(f[2 * j] * 16384.f * s, f[2 * j + 1] * 16384.f * s);
              }
            }
          } else {
#pragma unroll
            for (int i = 0; i < V / 2; ++i) packed[i] = 0u;
          }
          uint4* dst = reinterpret_cast<uint4*>(Bs + r * kLdab + c0);
#pragma unroll
          for (int i = 0; i < V / 8; ++i)
            dst[i] =
                make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTK; kk += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
          for (int i = 0; i < 2; ++i)
            wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * kLdab + kk, kLdab);
#pragma unroll
          for (int j = 0; j < 2; ++j)
            wmma::load_matrix_sync(fb[j], Bs + (wn * 32 + j * 16) * kLdab + kk, kLdab);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
      }
      // epilogue through shared memory (the operand tiles are free after the last barrier)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * kLdc + wn * 32 + j * 16, acc[i][j],
                                  kLdc, wmma::mem_row_major);
      __syncthreads();
      for (int idx = tid; idx < kTM * kOutPerTile; idx += kThreads) {
        const int r = idx / kOutPerTile, c = idx % kOutPerTile;
        const int64_t item = m0 + r, out = o0 + c;
        if (item >= rcnt || out >= a.n_out) continue;
        const int64_t yr = a.list ? int64_t(a.list[rbeg + item]) : item;
        const float v = SWIGLU ? swiglu_act(Cs[r * kLdc + c], Cs[r * kLdc + kTN / 2 + c], a.limit)
                               : Cs[r * kLdc + c];
        a.y[yr * a.ldy + out] = v;
      }
      __syncthreads();  // Cs aliases the operand tiles of the next step
    }
  }
}

template <WFormat F>
Status launch(const GemvArgs& a, dim3 grid, cudaStream_t stream) {
  if (a.swiglu)
    wmma_gemm_kernel<F, true><<<grid, kThreads, 0, stream>>>(a);
  else
    wmma_gemm_kernel<F, false><<<grid, kThreads, 0, stream>>>(a);
  return check_launch("wmma_gemm_kernel");
}

}  // namespace

bool wmma_gemm_supported(const WeightView& w, const float* x, int64_t ldx) {
  if (w.format == WFormat::kF32 || w.k <= 0 || w.k % kTK) return false;
  if (reinterpret_cast<uintptr_t>(w.data) % 16 || wrow_bytes(w.format, w.k) % 16) return false;
  if (ldx % 4 || reinterpret_cast<uintptr_t>(x) % 16) return false;
  return true;
}

Status wmma_gemm(const GemvArgs& a, int grid_y, int num_sms, cudaStream_t stream) {
  if (a.n_out <= 0 || (!a.list && a.rows <= 0) || grid_y <= 0) return Status::Ok();
  if (!wmma_gemm_supported(a.w, a.x, a.ldx))
    return errorf(ErrorCode::kUnsupported, "wmma_gemm: {} view k={} not supported",
                  ops::wformat_name(a.w.format), a.w.k);
  const int64_t per_tile = a.swiglu ? kTN / 2 : kTN;
  const int64_t ntiles = (a.n_out + per_tile - 1) / per_tile;
  dim3 grid;
  if (a.list) {
    const int64_t gx = std::min<int64_t>(
        ntiles, std::max<int64_t>(1, (8 * int64_t(num_sms) + grid_y - 1) / grid_y));
    grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(grid_y));
  } else {
    const int64_t mtiles = (a.rows + kTM - 1) / kTM;
    if (ntiles > 65535)
      return errorf(ErrorCode::kUnsupported, "wmma_gemm: {} output tiles", ntiles);
    grid = dim3(static_cast<unsigned>(mtiles), static_cast<unsigned>(ntiles));
  }
  switch (a.w.format) {
    case WFormat::kBF16:
      return launch<WFormat::kBF16>(a, grid, stream);
    case WFormat::kFP8Block:
      return launch<WFormat::kFP8Block>(a, grid, stream);
    case WFormat::kMXFP4:
      return launch<WFormat::kMXFP4>(a, grid, stream);
    case WFormat::kF32:
      break;
  }
  return errorf(ErrorCode::kUnsupported, "wmma_gemm: f32 weights");
}

}  // namespace v4::cuda
