#include "ops/cuda/cuda_common.h"  // first: FMT_CONSTEXPR note
// MoE experts over native weight formats (see moe.h).
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "ops/cuda/dense_mma.h"
#include "ops/cuda/device_util.cuh"
#include "ops/cuda/gmoe_mma.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/wformat.cuh"

namespace v4::cuda {
namespace {

using ops::MoeArgs;

__device__ __forceinline__ bool valid_expert(int32_t e, int E) {
  return e >= 0 && e < E;
}

__device__ __forceinline__ float swiglu(float g, float u, float lim) {
  if (lim > 0.f) {
    g = fminf(g, lim);
    u = fminf(fmaxf(u, -lim), lim);
  }
  return g / (1.f + expf(-g)) * u;
}

// ---- fp32 mode: one warp per output dot product -------------------------------------------------
// gu[p, c] = x[p/k] · dequant(w13[e_p])[c], c < 2I, p = t·k + j (fixed lane-strided order + tree).
__global__ void moe_up_fp32_kernel(MoeArgs a, float* __restrict__ gu) {
  const int D = a.hidden, I2 = 2 * a.inter;
  const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t P = a.n_rows * a.topk;
  if (wid >= P * I2) return;
  const int64_t p = wid / I2;
  const int c = int(wid % I2);
  const int e = a.idx[p];
  float s = 0.f;
  if (valid_expert(e, a.n_experts)) {
    const float* xr = a.x + (p / a.topk) * D;
    for (int i = lane; i < D; i += 32) s += xr[i] * wval(a.w13, e, c, i);
  }
  for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) gu[p * I2 + c] = s;
}

__global__ void moe_act_fp32_kernel(const float* __restrict__ gu, int64_t P, int I, float lim,
                                    float* __restrict__ act) {
  const int64_t total = P * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / I;
    const int c = int(i - p * I);
    act[i] = swiglu(gu[p * 2 * I + c], gu[p * 2 * I + I + c], lim);
  }
}

// down[p, c] = act[p] · dequant(w2[e_p])[c], c < D
__global__ void moe_down_fp32_kernel(MoeArgs a, const float* __restrict__ act,
                                     float* __restrict__ down) {
  const int D = a.hidden, I = a.inter;
  const int64_t wid = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t P = a.n_rows * a.topk;
  if (wid >= P * D) return;
  const int64_t p = wid / D;
  const int c = int(wid % D);
  const int e = a.idx[p];
  float s = 0.f;
  if (valid_expert(e, a.n_experts)) {
    const float* ar = act + p * I;
    for (int i = lane; i < I; i += 32) s += ar[i] * wval(a.w2, e, c, i);
  }
  for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) down[p * D + c] = s;
}

// out[t, c] = Σ_j weight[t,j] · down[row(t·k + j), c] in j order, over valid experts only.
// mode 0: row = p (per-pair rows); 1: row = pos_of[p] (expert-sorted rows); 2: row = t (per token).
__global__ void moe_combine_kernel(MoeArgs a, const float* __restrict__ down,
                                   const int32_t* __restrict__ pos_of, int mode) {
  const int D = a.hidden, k = a.topk;
  const int64_t total = a.n_rows * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D;
    const int c = int(i - t * D);
    float o = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      if (!valid_expert(a.idx[p], a.n_experts)) continue;
      const int64_t row = mode == 0 ? p : mode == 1 ? int64_t(pos_of[p]) : t;
      o += down[row * D + c] * a.weight[p];
    }
    a.out[i] = o;
  }
}

// moe_combine_kernel for D % 4 == 0 and 16-byte aligned down / out: 4 columns a thread, float4
// loads and stores, the same FMA chain per column in j order (same bits). The scalar kernel ran
// at ~2 TB/s at prefill sizes (99 µs for 2,048 tokens × 6 rows of 4,096: ncu-kernels-s19.md).
__global__ void moe_combine_vec_kernel(MoeArgs a, const float* __restrict__ down,
                                       const int32_t* __restrict__ pos_of, int mode) {
  const int D = a.hidden, k = a.topk, D4 = D / 4;
  const int64_t total = a.n_rows * D4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D4;
    const int c = int(i - t * D4) * 4;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < k; ++j) {
      const int64_t p = t * k + j;
      if (!valid_expert(a.idx[p], a.n_experts)) continue;
      const int64_t row = mode == 0 ? p : mode == 1 ? int64_t(pos_of[p]) : t;
      const float4 d = *reinterpret_cast<const float4*>(down + row * D + c);
      const float wt = a.weight[p];
      o.x += d.x * wt;
      o.y += d.y * wt;
      o.z += d.z * wt;
      o.w += d.w * wt;
    }
    *reinterpret_cast<float4*>(a.out + t * D + c) = o;
  }
}

// out = the combine of `down` (moe_combine_kernel's modes); the vector kernel where it applies
// (V4_COMBINE_VEC=0: always the scalar one, for A/B runs).
Status moe_combine(const MoeArgs& a, const float* down, const int32_t* pos_of, int mode,
                   cudaStream_t stream) {
  const char* env = std::getenv("V4_COMBINE_VEC");
  const bool vec = a.hidden % 4 == 0 && reinterpret_cast<uintptr_t>(down) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && !(env && env[0] == '0');
  if (vec) {
    moe_combine_vec_kernel<<<grid_for(a.n_rows * (a.hidden / 4), 256), 256, 0, stream>>>(
        a, down, pos_of, mode);
    V4_CUDA_CHECK_LAUNCH("moe_combine_vec_kernel");
    return Status::Ok();
  }
  moe_combine_kernel<<<grid_for(a.n_rows * a.hidden, 256), 256, 0, stream>>>(a, down, pos_of,
                                                                           mode);
  V4_CUDA_CHECK_LAUNCH("moe_combine_kernel");
  return Status::Ok();
}

// ---- device routing (bf16 mode)
// ------------------------------------------------------------------ One block: counts per expert
// (shared-memory atomics), offsets (exclusive scan), the ascending list of active experts and its
// length, then every valid pair p is placed into its expert's range of `list` (order inside a range
// is arbitrary: each pair's result does not depend on it). pos_of[p] = position of p in `list` (−1
// for an invalid expert id).
__global__ void __launch_bounds__(1024)
    moe_route_kernel(const int32_t* __restrict__ idx, int64_t P, int E,
                     int32_t* __restrict__ offset, int32_t* __restrict__ active,
                     int32_t* __restrict__ active_count, int32_t* __restrict__ list,
                     int32_t* __restrict__ pos_of) {
  extern __shared__ int32_t route_sm[];
  int32_t* cnt = route_sm;
  int32_t* cur = route_sm + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int32_t e = idx[p];
    if (valid_expert(e, E)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int per = (E + 31) / 32;
    const int e0 = min(E, lane * per), e1 = min(E, e0 + per);
    int s = 0, na = 0;
    for (int e = e0; e < e1; ++e) {
      s += cnt[e];
      na += cnt[e] > 0;
    }
    int is = s, ia = na;
    for (int off = 1; off < 32; off <<= 1) {
      const int ts = __shfl_up_sync(0xffffffffu, is, off);
      const int ta = __shfl_up_sync(0xffffffffu, ia, off);
      if (lane >= off) {
        is += ts;
        ia += ta;
      }
    }
    int base = is - s, abase = ia - na;
    for (int e = e0; e < e1; ++e) {
      offset[e] = base;
      cur[e] = base;
      if (cnt[e] > 0) active[abase++] = e;
      base += cnt[e];
    }
    if (lane == 31) {
      offset[E] = is;
      *active_count = ia;
    }
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int32_t e = idx[p];
    if (valid_expert(e, E)) {
      const int32_t pos = atomicAdd(&cur[e], 1);
      list[pos] = int32_t(p);
      pos_of[p] = pos;
    } else {
      pos_of[p] = -1;
    }
  }
}

// xs[i, :] = bf16(x[list[i] / k, :]) for i < offset[E] (expert-sorted rows).
__global__ void gather_rows_bf16_kernel(const float* __restrict__ x, int D,
                                        const int32_t* __restrict__ list,
                                        const int32_t* __restrict__ total, int k, int64_t P,
                                        __nv_bfloat16* __restrict__ xs) {
  const int64_t tot = *total;
  const int64_t n = P < tot ? P : tot;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * D;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, c = i - r * D;
    xs[i] = __float2bfloat16_rn(x[int64_t(list[r] / k) * D + c]);
  }
}

// act[r, c] = bf16(swiglu(gu[r, c], gu[r, I + c])) for r < rows (rows = *total when given).
__global__ void swiglu_bf16_kernel(const float* __restrict__ gu, int64_t rows,
                                   const int32_t* __restrict__ total, int I, float lim,
                                   __nv_bfloat16* __restrict__ act) {
  const int64_t tot = total ? int64_t(*total) : rows;
  const int64_t n = rows < tot ? rows : tot;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * I;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, c = i - r * I;
    act[i] = __float2bfloat16_rn(swiglu(gu[r * 2 * I + c], gu[r * 2 * I + I + c], lim));
  }
}

struct RouteBufs {
  int32_t *offset, *active, *active_count, *list, *pos_of;
};

size_t route_ints(int64_t P, int E) {
  return size_t(E + 1) + size_t(E) + 1 + 2 * size_t(P);
}

RouteBufs route_bufs(int32_t* base, int64_t P, int E) {
  RouteBufs b;
  b.offset = base;
  b.active = b.offset + E + 1;
  b.active_count = b.active + E;
  b.list = b.active_count + 1;
  b.pos_of = b.list + P;
  return b;
}

enum class MoePath { kFp32, kGemv, kFused, kDenseShared, kSyncGemm, kMma, kGrouped };

// Whether a call of path `path` (choose_path) with S rows wants the grouped tensor-core GEMM
// (before the per-view checks of grouped_eligible).
bool grouped_wanted(MoePath path, int64_t S, int E, const KernelContext& c) {
  if (!c.grouped_moe || E <= 1) return false;
  if (path == MoePath::kSyncGemm) return true;
  return path == MoePath::kGemv && c.grouped_min_rows > 0 && S >= c.grouped_min_rows;
}

// Routed experts whose two weights gmoe_mma supports (x rows loadable as float4), within the
// grid's tile limit.
bool grouped_eligible(const ops::WeightView& w13, const ops::WeightView& w2, int64_t P, int E,
                      bool x_aligned) {
  return x_aligned && gmoe_supported(w13) && gmoe_supported(w2) &&
         gmoe_max_tiles(P, E) <= 65535;
}

// The path of a call before the per-view checks of moe_bf16 (kGemv may become kMma there).
MoePath choose_path(bool bf16, int64_t S, int E, int k, const KernelContext& c) {
  if (!bf16) return MoePath::kFp32;
  if (c.fused_tc && S >= c.fused_moe_min_rows) return MoePath::kFused;
  if (E == 1 && S > c.gemv_max_rows) return MoePath::kDenseShared;
  if (S * k >= c.sync_min_pairs) return MoePath::kSyncGemm;
  return MoePath::kGemv;
}

// Routed experts whose two weights moe_mma supports, x rows loadable as float4.
bool mma_eligible(const ops::WeightView& w13, const ops::WeightView& w2, int E, bool x_aligned,
                  const KernelContext& c) {
  return c.moe_mma && E > 1 && x_aligned && moe_mma_supported(w13) && moe_mma_supported(w2);
}

// bf16 view of expert e of `w` for cuBLASLt: the stored rows when bf16, else dequantized into
// the scratch slot.
Result<const __nv_bfloat16*> expert_bf16(const ops::WeightView& w, int64_t e,
                                         const KernelContext& c, size_t wbytes) {
  if (w.format == ops::WFormat::kBF16) return reinterpret_cast<const __nv_bfloat16*>(wrow(w, e, 0));
  auto* d = static_cast<__nv_bfloat16*>(c.get(kSlotWBf16, wbytes));
  V4_RETURN_IF_ERROR(dequant_view_bf16(w, e, d, c.stream));
  return static_cast<const __nv_bfloat16*>(d);
}

Status check_args(const MoeArgs& a) {
  const auto& u = a.w13;
  const auto& d = a.w2;
  if (a.topk <= 0 || a.hidden <= 0 || a.inter <= 0 || a.n_experts <= 0 ||
      u.n != 2 * int64_t(a.inter) || u.k != a.hidden || d.n != a.hidden || d.k != a.inter ||
      u.experts < a.n_experts || d.experts < a.n_experts)
    return errorf(
        ErrorCode::kInvalidArgument,
        "moe_experts: w13 [{}, {}] ×{} / w2 [{}, {}] ×{} do not match D={} I={} E={} k={}", u.n,
        u.k, u.experts, d.n, d.k, d.experts, a.hidden, a.inter, a.n_experts, a.topk);
  return Status::Ok();
}

void path_bytes(MoePath path, int64_t S, int D, int I, int E, int k, size_t* bytes) {
  const int64_t P = S * k;
  auto need = [&](int slot, size_t b) { bytes[slot] = std::max(bytes[slot], b); };
  switch (path) {
    case MoePath::kFp32:
      need(kSlotF32A, size_t(P) * 2 * I * 4);
      need(kSlotF32B, size_t(P) * I * 4);
      need(kSlotF32C, size_t(P) * D * 4);
      break;
    case MoePath::kGemv:
    case MoePath::kFused:
      need(kSlotMoeInts, route_ints(P, E) * 4);
      need(kSlotF32A, size_t(P) * I * 4);
      need(kSlotF32C, size_t(P) * D * 4);
      break;
    case MoePath::kMma:
      need(kSlotMoeInts, route_ints(P, E) * 4);
      need(kSlotActBf16, size_t(P) * I * 2);
      need(kSlotF32C, size_t(P) * D * 4);
      break;
    case MoePath::kGrouped:
      need(kSlotMoeInts, (route_ints(P, E) + 2 * size_t(gmoe_max_tiles(P, E)) + 1) * 4);
      need(kSlotXBf16, size_t(P) * D * 2);
      need(kSlotActBf16, size_t(P) * I * 2);
      need(kSlotF32C, size_t(P) * D * 4);
      break;
    case MoePath::kDenseShared:
      need(kSlotXBf16, size_t(S) * D * 2);
      need(kSlotWBf16, size_t(2) * I * D * 2);
      need(kSlotF32A, size_t(S) * 2 * I * 4);
      need(kSlotActBf16, size_t(S) * I * 2);
      need(kSlotF32C, size_t(S) * D * 4);
      break;
    case MoePath::kSyncGemm:
      need(kSlotMoeInts, route_ints(P, E) * 4);
      need(kSlotXBf16, size_t(P) * D * 2);
      need(kSlotWBf16, size_t(2) * I * D * 2);
      need(kSlotF32A, size_t(P) * 2 * I * 4);
      need(kSlotActBf16, size_t(P) * I * 2);
      need(kSlotF32C, size_t(P) * D * 4);
      break;
  }
}

}  // namespace

void moe_scratch_bytes(bool bf16, int64_t S, int D, int I, int E, int k, const KernelContext& c,
                       size_t* bytes) {
  const MoePath path = choose_path(bf16, S, E, k, c);
  path_bytes(path, S, D, I, E, k, bytes);
  if (path == MoePath::kDenseShared && c.dense_mma) {  // dense_mma's own scratch + f32 act
    dense_mma_scratch_bytes(S, 2 * int64_t(I), D, c.num_sms, bytes);
    dense_mma_scratch_bytes(S, D, I, c.num_sms, bytes);
    bytes[kSlotF32B] = std::max(bytes[kSlotF32B], size_t(S) * I * 4);
  }
  // The per-view choice (kGemv → kMma) is made at call time: reserve both.
  if (path == MoePath::kGemv && c.moe_mma && E > 1) path_bytes(MoePath::kMma, S, D, I, E, k, bytes);
  // Likewise the grouped tensor-core path (its fallback, the sync path, syncs anyway and may grow
  // its scratch on first use).
  if (bf16 && grouped_wanted(path, S, E, c)) path_bytes(MoePath::kGrouped, S, D, I, E, k, bytes);
}

bool moe_bf16_uses_tensor_cores(const ops::WeightView& w13, const ops::WeightView& w2, int64_t S,
                                int E, int k, bool x_aligned, const KernelContext& c) {
  const MoePath path = choose_path(true, S, E, k, c);
  if (grouped_wanted(path, S, E, c) && grouped_eligible(w13, w2, S * k, E, x_aligned)) return true;
  if (path == MoePath::kGemv) return mma_eligible(w13, w2, E, x_aligned, c);
  return path != MoePath::kFp32;
}

Status moe_fp32(const MoeArgs& a, const KernelContext& c) {
  if (a.n_rows <= 0) return Status::Ok();
  V4_RETURN_IF_ERROR(check_args(a));
  size_t need[kNumScratchSlots] = {};
  moe_scratch_bytes(false, a.n_rows, a.hidden, a.inter, a.n_experts, a.topk, c, need);
  const int64_t P = a.n_rows * a.topk;
  auto* gu = static_cast<float*>(c.get(kSlotF32A, need[kSlotF32A]));
  auto* act = static_cast<float*>(c.get(kSlotF32B, need[kSlotF32B]));
  auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
  const int64_t w1 = P * 2 * a.inter, w2 = P * a.hidden;
  moe_up_fp32_kernel<<<grid_for(w1 * 32, 256, int64_t(1) << 31), 256, 0, c.stream>>>(a, gu);
  V4_CUDA_CHECK_LAUNCH("moe_up_fp32_kernel");
  moe_act_fp32_kernel<<<grid_for(P * a.inter, 256), 256, 0, c.stream>>>(gu, P, a.inter,
                                                                        a.swiglu_limit, act);
  V4_CUDA_CHECK_LAUNCH("moe_act_fp32_kernel");
  moe_down_fp32_kernel<<<grid_for(w2 * 32, 256, int64_t(1) << 31), 256, 0, c.stream>>>(a, act,
                                                                                       down);
  V4_CUDA_CHECK_LAUNCH("moe_down_fp32_kernel");
  V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 0, c.stream));
  return Status::Ok();
}

Status moe_bf16(const MoeArgs& a, const KernelContext& c) {
  if (a.n_rows <= 0) return Status::Ok();
  V4_RETURN_IF_ERROR(check_args(a));
  const int64_t S = a.n_rows, P = S * a.topk;
  const int D = a.hidden, I = a.inter, E = a.n_experts;
  MoePath path = choose_path(true, S, E, a.topk, c);
  if (path == MoePath::kFused &&
      !(wmma_gemm_supported(a.w13, a.x, D) && wmma_gemm_supported(a.w2, a.x, I))) {
    KernelContext no_fused = c;  // (act rows are scratch: aligned, stride I)
    no_fused.fused_tc = false;
    path = choose_path(true, S, E, a.topk, no_fused);
  }
  const bool x_aligned = D % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
  if (grouped_wanted(path, S, E, c) && grouped_eligible(a.w13, a.w2, P, E, x_aligned))
    path = MoePath::kGrouped;
  if (path == MoePath::kGemv && mma_eligible(a.w13, a.w2, E, x_aligned, c)) path = MoePath::kMma;
  if (path == MoePath::kGemv && !(wgemv_supported(a.w13) && wgemv_supported(a.w2)))
    path = E == 1 ? MoePath::kDenseShared : MoePath::kSyncGemm;  // exotic views only
  size_t need[kNumScratchSlots] = {};
  path_bytes(path, S, D, I, E, a.topk, need);

  if (path == MoePath::kDenseShared && c.dense_mma && dense_mma_supported(a.w13, a.x, D, S) &&
      dense_mma_supported(a.w2, a.x, I, S)) {
    // One expert on the dense tensor-core GEMM over native bytes: gate/up, SwiGLU (f32), down.
    auto* gu = static_cast<float*>(c.get(kSlotF32A, size_t(S) * 2 * I * 4));
    auto* act = static_cast<float*>(c.get(kSlotF32B, size_t(S) * I * 4));
    auto* down = static_cast<float*>(c.get(kSlotF32C, size_t(S) * D * 4));
    V4_RETURN_IF_ERROR(dense_mma(a.x, D, a.w13, S, gu, 2 * int64_t(I), c));
    moe_act_fp32_kernel<<<grid_for(S * I, 256), 256, 0, c.stream>>>(gu, S, I, a.swiglu_limit, act);
    V4_CUDA_CHECK_LAUNCH("moe_act_fp32_kernel");
    V4_RETURN_IF_ERROR(dense_mma(act, I, a.w2, S, down, D, c));
    V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 2, c.stream));
    return Status::Ok();
  }
  if (path == MoePath::kDenseShared) {
    // One expert: per-token dense GEMMs (x and W as bf16, tensor cores), combine per token.
    auto* xb = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, need[kSlotXBf16]));
    auto* gu = static_cast<float*>(c.get(kSlotF32A, need[kSlotF32A]));
    auto* actb = static_cast<__nv_bfloat16*>(c.get(kSlotActBf16, need[kSlotActBf16]));
    auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
    V4_RETURN_IF_ERROR(rows_to_bf16(a.x, D, S, D, xb, c.stream));
    V4_ASSIGN_OR_RETURN(const __nv_bfloat16* w13, expert_bf16(a.w13, 0, c, need[kSlotWBf16]));
    V4_RETURN_IF_ERROR(c.gemm->bf16_strided(xb, D, w13, D, gu, 2 * int64_t(I), OutType::kF32, S,
                                            2 * int64_t(I), D, c.stream));
    swiglu_bf16_kernel<<<grid_for(S * I, 256), 256, 0, c.stream>>>(gu, S, nullptr, I,
                                                                   a.swiglu_limit, actb);
    V4_CUDA_CHECK_LAUNCH("swiglu_bf16_kernel");
    V4_ASSIGN_OR_RETURN(const __nv_bfloat16* w2, expert_bf16(a.w2, 0, c, need[kSlotWBf16]));
    V4_RETURN_IF_ERROR(
        c.gemm->bf16_strided(actb, I, w2, I, down, D, OutType::kF32, S, D, I, c.stream));
    V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 2, c.stream));
    return Status::Ok();
  }

  auto* ints = static_cast<int32_t*>(c.get(kSlotMoeInts, need[kSlotMoeInts]));
  const RouteBufs rb = route_bufs(ints, P, E);
  const size_t route_smem = size_t(2) * E * sizeof(int32_t);
  if (route_smem > 48 * 1024)
    return errorf(ErrorCode::kUnsupported, "moe_experts: {} experts > 6144", E);
  moe_route_kernel<<<1, 1024, route_smem, c.stream>>>(a.idx, P, E, rb.offset, rb.active,
                                                      rb.active_count, rb.list, rb.pos_of);
  V4_CUDA_CHECK_LAUNCH("moe_route_kernel");

  if (path == MoePath::kGrouped) {
    // Grouped tensor-core GEMMs over native bytes, no sync: tile list, gather (bf16, logical k
    // order of w13), gate/up + SwiGLU → act (logical k order of w2), down → per-pair rows.
    const int64_t max_tiles = gmoe_max_tiles(P, E);
    int32_t* tile_expert = ints + route_ints(P, E);
    int32_t* tile_item = tile_expert + max_tiles;
    int32_t* tile_count = tile_item + max_tiles;
    auto* xs = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, need[kSlotXBf16]));
    auto* act = static_cast<__nv_bfloat16*>(c.get(kSlotActBf16, need[kSlotActBf16]));
    auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
    V4_RETURN_IF_ERROR(gmoe_tiles(rb.offset, rb.active, rb.active_count, tile_expert, tile_item,
                                  tile_count, c.stream));
    V4_RETURN_IF_ERROR(gmoe_gather(a.x, D, a.topk, rb.list, rb.offset + E, P, D, a.w13.format, xs,
                                   c.stream));
    GmoeArgs up;
    up.w = a.w13;
    up.xb = xs;
    up.act = act;
    up.act_format = a.w2.format;
    up.n_out = I;
    up.swiglu = true;
    up.limit = a.swiglu_limit;
    up.list = rb.list;
    up.offset = rb.offset;
    up.tile_expert = tile_expert;
    up.tile_item = tile_item;
    up.tile_count = tile_count;
    // 8 warps measured faster for MXFP4 experts (9.0 vs 14.7 ms at 4,096 tokens) and slower for
    // FP8 ones (9.67 vs 9.46 ms; bench/results/cuda-moe.md): FP8 keeps 4 unless forced.
    up.warps = c.gmoe_warps == 8 && a.w13.format == ops::WFormat::kFP8Block ? 4 : c.gmoe_warps;
    up.wgmma = c.gmoe_wgmma;
    up.wg_variant = c.gmoe_wg_variant;
    V4_RETURN_IF_ERROR(gmoe_mma(up, max_tiles, c.stream));
    GmoeArgs dn = up;
    dn.w = a.w2;
    dn.xb = act;
    dn.act = nullptr;
    dn.swiglu = false;
    dn.y = down;
    dn.ldy = D;
    dn.n_out = D;
    V4_RETURN_IF_ERROR(gmoe_mma(dn, max_tiles, c.stream));
    V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 0, c.stream));
    return Status::Ok();
  }

  if (path == MoePath::kMma) {
    auto* act = static_cast<__nv_bfloat16*>(c.get(kSlotActBf16, need[kSlotActBf16]));
    auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
    const int slots = int(std::min<int64_t>(E, P));
    MoeMmaArgs up;
    up.w = a.w13;
    up.x = a.x;
    up.ldx = D;
    up.xdiv = a.topk;
    up.act = act;
    up.n_out = I;
    up.swiglu = true;
    up.limit = a.swiglu_limit;
    up.list = rb.list;
    up.offset = rb.offset;
    up.active = rb.active;
    up.active_count = rb.active_count;
    up.tokens = S;
    // 2 ≤ S < 8 keep version 1: version 2 measured slower there (S = 1 before session 28:
    // MXFP4 70.1 vs 67.6 µs, FP8 92.2 vs 80.3; from S = 8 on v2 wins: 265 vs 297 µs; cuda-moe.md),
    // and at K = 4096 its x rows then leave one CTA per SM. S = 1 runs version 2 since session
    // 28: its two-CTAs-per-SM form with 4 K slices (moe_mma_choose) beat version 1 in the served
    // batch-1 step (4K 5.01 → 4.94 ms, 900K 5.37 → 5.28; bench-v4flash-20l-moe-small-s28.md).
    up.version = c.moe_mma_version == 2 && S > 1 && S < 8 ? 1 : c.moe_mma_version;
    V4_RETURN_IF_ERROR(moe_mma(up, slots, c.num_sms, c.stream));
    MoeMmaArgs dn = up;
    dn.w = a.w2;
    dn.x = nullptr;
    dn.xb = act;
    dn.act = nullptr;
    dn.y = down;
    dn.ldy = D;
    dn.n_out = D;
    dn.swiglu = false;
    V4_RETURN_IF_ERROR(moe_mma(dn, slots, c.num_sms, c.stream));
    V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 0, c.stream));
    return Status::Ok();
  }

  if (path == MoePath::kGemv || path == MoePath::kFused) {
    auto* act = static_cast<float*>(c.get(kSlotF32A, need[kSlotF32A]));
    auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
    const int slots = int(std::min<int64_t>(E, P));
    GemvArgs up;
    up.w = a.w13;
    up.x = a.x;
    up.ldx = D;
    up.y = act;
    up.ldy = I;
    up.n_out = I;
    up.swiglu = true;
    up.limit = a.swiglu_limit;
    up.list = rb.list;
    up.offset = rb.offset;
    up.active = rb.active;
    up.active_count = rb.active_count;
    up.xdiv = a.topk;
    // The shared-memory GEMV, not gemv_stream: at 1 row the shared expert's SwiGLU w13 took 16.6
    // µs with the streaming kernel vs 12.7, its w2 9.55 vs 9.03 (H200, bench/results/cuda-gemv.md,
    // before gemv_stream's persistent grid). V4_MOE_GEMV_STREAM=1: gemv_stream (A/B).
    static const bool moe_stream = [] {
      const char* e = std::getenv("V4_MOE_GEMV_STREAM");
      return e && e[0] == '1';
    }();
    up.use_stream_kernel = moe_stream;
    // Rows per shared-memory pass: at most S rows per expert (unless a token repeats one);
    // V4_MOE_PASS_ROWS caps it (fewer rows per pass: more blocks per SM, but experts with more
    // rows than a pass re-read their weights).
    static const int64_t pass_cap = [] {
      const char* e = std::getenv("V4_MOE_PASS_ROWS");
      return e && std::atoi(e) > 0 ? int64_t(std::atoi(e)) : int64_t(0);
    }();
    // Default from the H200 sweep (bench/results/cuda-wformat.md): 2-row passes win at S = 16
    // and 64 (1.39× / 1.13×), the 8-row template at S = 256.
    up.rows_hint = std::min<int64_t>(S, pass_cap > 0 ? pass_cap : (S <= 64 ? 2 : S));
    const bool fused = path == MoePath::kFused;
    V4_RETURN_IF_ERROR(fused ? wmma_gemm(up, slots, c.num_sms, c.stream)
                             : wgemv(up, slots, c.num_sms, c.stream));
    GemvArgs dn = up;
    dn.w = a.w2;
    dn.x = act;
    dn.ldx = I;
    dn.y = down;
    dn.ldy = D;
    dn.n_out = D;
    dn.swiglu = false;
    dn.xdiv = 1;
    V4_RETURN_IF_ERROR(fused ? wmma_gemm(dn, slots, c.num_sms, c.stream)
                             : wgemv(dn, slots, c.num_sms, c.stream));
    V4_RETURN_IF_ERROR(moe_combine(a, down, nullptr, 0, c.stream));
    return Status::Ok();
  }

  // Prefill-sized: read the per-expert offsets back (one sync), then per active expert
  // cuBLASLt GEMMs on a bf16 copy of that expert, over expert-sorted rows.
  std::vector<int32_t> off(size_t(E) + 1);
  V4_CUDA_TRY(cudaMemcpyAsync(off.data(), rb.offset, off.size() * sizeof(int32_t),
                              cudaMemcpyDeviceToHost, c.stream));
  V4_CUDA_TRY(cudaStreamSynchronize(c.stream));
  auto* xs = static_cast<__nv_bfloat16*>(c.get(kSlotXBf16, need[kSlotXBf16]));
  auto* gu = static_cast<float*>(c.get(kSlotF32A, need[kSlotF32A]));
  auto* actb = static_cast<__nv_bfloat16*>(c.get(kSlotActBf16, need[kSlotActBf16]));
  auto* down = static_cast<float*>(c.get(kSlotF32C, need[kSlotF32C]));
  gather_rows_bf16_kernel<<<grid_for(P * D, 256), 256, 0, c.stream>>>(a.x, D, rb.list,
                                                                      rb.offset + E, a.topk, P, xs);
  V4_CUDA_CHECK_LAUNCH("gather_rows_bf16_kernel");
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n <= 0) continue;
    V4_ASSIGN_OR_RETURN(const __nv_bfloat16* w13, expert_bf16(a.w13, e, c, need[kSlotWBf16]));
    V4_RETURN_IF_ERROR(c.gemm->bf16_strided(xs + r0 * D, D, w13, D, gu + r0 * 2 * I, 2 * int64_t(I),
                                            OutType::kF32, n, 2 * int64_t(I), D, c.stream));
  }
  swiglu_bf16_kernel<<<grid_for(P * I, 256), 256, 0, c.stream>>>(gu, P, rb.offset + E, I,
                                                                 a.swiglu_limit, actb);
  V4_CUDA_CHECK_LAUNCH("swiglu_bf16_kernel");
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n <= 0) continue;
    V4_ASSIGN_OR_RETURN(const __nv_bfloat16* w2, expert_bf16(a.w2, e, c, need[kSlotWBf16]));
    V4_RETURN_IF_ERROR(c.gemm->bf16_strided(actb + r0 * I, I, w2, I, down + r0 * D, D,
                                            OutType::kF32, n, D, I, c.stream));
  }
  V4_RETURN_IF_ERROR(moe_combine(a, down, rb.pos_of, 1, c.stream));
  return Status::Ok();
}

}  // namespace v4::cuda
