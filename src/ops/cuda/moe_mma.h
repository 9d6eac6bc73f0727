// Routed-expert grouped GEMM on tensor cores for decode-sized MoE calls (bf16 precision mode):
// the expert's native weight bytes (FP8 128×128 blocks or MXFP4) are the A operand (weight rows
// = mma M), the expert's tokens the B operand (mma N = 8 tokens per pass), bf16 mma.sync
// m16n8k16 with fp32 accumulation. Every active expert's weights are read once per pass of
// 8 tokens (one pass for all but the most loaded experts at decode batch sizes), through a
// per-warp cp.async ring (no block barrier in the K loop); x is staged once per CTA pass.
// Version 2 (default): 16 tokens per pass for S > 8 (weights read once for up to 16 items),
// S ≤ 8: only S x rows staged, small enough for two CTAs per SM (batch-1 decode), MXFP4 tiles
// without scales > 128 skip the second dequantization multiply (warp-uniform branch).
// See moe_mma.cu for the operand layout (a k permutation that lets each lane consume its own
// 16-byte weight chunks) and docs/cuda.md §MoE.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Arguments of one grouped expert GEMM (gate/up with SwiGLU, or down), over the routing of
/// moe.cu (pairs sorted by expert: expert e owns items offset[e] .. offset[e+1] of `list`,
/// item i is pair list[i] = token·k + slot; active[y] for y < *active_count are the experts
/// with at least one pair).
///   swiglu (up):  act[i, o] = bf16(silu(min(g, lim)) · clamp(u, −lim, lim)), g/u = x[list[i]/xdiv]
///                 · W[o] / W[n_out + o] (lim ≤ 0: no clamp), o < n_out; W has 2·n_out rows.
///   plain (down): y[list[i], o] = xb[i] · W[o] (f32), o < n_out = W rows.
struct MoeMmaArgs {
  ops::WeightView w;                  // E experts of [rows, K], kFP8Block or kMXFP4
  const float* x = nullptr;           // swiglu: f32 token rows [S, ldx]
  int64_t ldx = 0;
  int xdiv = 1;                       // swiglu: token of pair p = p / xdiv
  const __nv_bfloat16* xb = nullptr;  // plain: bf16 rows per item [P, K] (expert-sorted)
  __nv_bfloat16* act = nullptr;       // swiglu output [P, n_out] per item (expert-sorted)
  float* y = nullptr;                 // plain output [P, ldy] per pair
  int64_t ldy = 0;
  int64_t n_out = 0;
  bool swiglu = false;
  float limit = 0.f;
  const int32_t* list = nullptr;          // [P]
  const int32_t* offset = nullptr;        // [E + 1]
  const int32_t* active = nullptr;        // [E]
  const int32_t* active_count = nullptr;  // [1]
  /// Tokens S of the call (pairs = S·xdiv); 0 = unknown. Only picks the kernel configuration
  /// (moe_mma_choose); any routing is computed correctly whatever the value.
  int64_t tokens = 0;
  /// 2 (default): the configurations of moe_mma_choose (16-token passes for S > 8, S staged x
  /// rows and two CTAs per SM for S ≤ 8); 1: the old kernel (8 tokens per pass), for A/B runs;
  /// 3: as 2, but 2 ≤ S ≤ 128 with ≥ 2 CTAs per SM of work run two CTAs per SM with 2-deep
  /// rings, and K = 4096 takes 16-token passes with a 2-deep ring at P ≥ 4·slots
  /// (experimental, A/B).
  int version = 2;
};

/// Launch configuration of one moe_mma call (see moe_mma.cu): ks warps split K per row group
/// (1, 4, 8), nt token columns per pass (8, 16), st cp.async ring depth, minb CTAs per SM the
/// registers are limited for, xr x rows staged per pass (items per pass, ≤ nt), version 1 (the
/// old kernel's code: one x unit per thread in flight, MXFP4 second multiply always issued) or
/// 2 (batched x staging, warp-uniform MXFP4 fast form). Same ks → same bits.
struct MoeMmaChoice {
  int ks = 1, nt = 8, st = 3, minb = 1, xr = 8, version = 2;
};

/// The configuration moe_mma runs for `a` over `slots` expert slots on `num_sms` SMs (exposed
/// for the tests and the bench table). Deterministic in (version, tokens, shapes, slots, SMs).
MoeMmaChoice moe_mma_choose(const MoeMmaArgs& a, int slots, int num_sms);

/// Whether moe_mma can run `w` as an expert weight with inputs of K = w.k columns: FP8 with
/// K % 128 == 0 or MXFP4 with K % 256 == 0, 16-byte aligned rows and scale rows, and the
/// shared-memory tile (8 token rows of K bf16 + the weight ring) within the device limit.
bool moe_mma_supported(const ops::WeightView& w);

/// Runs the grouped GEMM over `slots` expert slots (min(E, pairs)); with few CTAs for the
/// `num_sms` SMs, 4 or 8 warps of a CTA split K (fixed-order sum; moe_mma_choose). No sync, no allocation
/// (graph-capturable). Errors: kUnsupported when !moe_mma_supported(a.w).
Status moe_mma(const MoeMmaArgs& a, int slots, int num_sms, cudaStream_t stream);

/// Runs the grouped GEMM with configuration `c` (tests and bench A/B; moe_mma runs
/// moe_mma_choose's). Instantiated (ks, nt, st, minb, version): (1|4, 8, 3, 1, 1|2),
/// (1, 16, 2|3, 1, 2), (1|4|8, 8, 3, 2, 2), (1, 8, 2, 2, 2),
/// (1, 8, 6, 1, 2), (2, 8, 4, 1, 2), (2, 8, 3, 2, 2), (4, 8, 4, 1, 2) (the last four: batch-1 A/B,
/// env V4_MOE_MMA_SMALL="ks/nt/st/minb/version" replaces moe_mma_choose's pick for 1..8 tokens). Errors: kUnsupported as moe_mma; kInvalidArgument for another
/// combination, xr outside 1..nt, or shared memory over the limit (minb 2: over half an SM).
Status moe_mma_run(const MoeMmaArgs& a, int slots, const MoeMmaChoice& c, cudaStream_t stream);

/// CTAs per SM the device holds for configuration `c` over `a`'s weight format, form and K
/// (cudaOccupancyMaxActiveBlocksPerMultiprocessor, after moe_mma_prepare; tests check that the
/// minb = 2 forms get 2). −1: no such configuration or a CUDA error.
int moe_mma_ctas_per_sm(const MoeMmaArgs& a, const MoeMmaChoice& c);

/// Sets the kernels' dynamic shared-memory limits (once per device, at backend creation).
Status moe_mma_prepare();

}  // namespace v4::cuda
