// Grouped tensor-core GEMM of the routed experts for prefill-sized MoE calls (bf16 precision
// mode), without a host sync: the grouped form of dense_mma (dense_mma.h). The pairs are routed
// on the device (moe.cu's moe_route_kernel: expert-sorted items, offsets, active experts), a
// tile list cuts every active expert's items into chunks of kGmoeChunk, and one CTA (4 warps ×
// 32 native FP8 / MXFP4 weight rows, the wfrag.cuh fragment layout) multiplies one chunk of
// one expert: weight and x k-tiles through a 3-stage cp.async ring, each dequantized weight
// chunk used for all the chunk's token tiles (mma N = 64). The gate/up form fuses SwiGLU and
// writes bf16 act rows already in the logical k order of the down weights, so the down GEMM
// reads them as is. See docs/cuda.md §Grouped MoE on tensor cores.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Items (pairs) per CTA of the grouped GEMM: an expert with n items owns ceil(n / 64) tiles.
constexpr int kGmoeChunk = 64;

/// Upper bound of the tile count for P pairs over E experts: floor(P / 64) + min(E, P).
int64_t gmoe_max_tiles(int64_t P, int E);

/// Arguments of one grouped GEMM launch over the tile list of gmoe_tiles.
///   swiglu (gate/up): act[i, pos(o)] = bf16(silu(min(g, lim)) · clamp(u, −lim, lim)) with
///     g = xb[i] · W_e[o], u = xb[i] · W_e[n_out + o] (lim ≤ 0: no clamp), o < n_out, W has
///     2·n_out rows; pos(o) = the logical k position of stored column o for a weight of format
///     act_format (kFP8Block / kMXFP4: gmoe_logical_col; any other format: pos(o) = o).
///   plain (down): y[list[i], o] = xb[i] · W_e[o] (f32), o < n_out ≤ W rows.
/// xb rows are in the logical k order of W's format (gmoe_gather writes them so), [P, K] bf16.
struct GmoeArgs {
  ops::WeightView w;                   // E experts of [rows, K], kFP8Block or kMXFP4
  const __nv_bfloat16* xb = nullptr;   // [P, K] expert-sorted items, logical k order
  __nv_bfloat16* act = nullptr;        // swiglu: [P, n_out]
  ops::WFormat act_format = ops::WFormat::kF32;
  float* y = nullptr;                  // plain: [pairs, ldy] f32, row = list[i]
  int64_t ldy = 0;
  int64_t n_out = 0;
  bool swiglu = false;
  float limit = 0.f;
  const int32_t* list = nullptr;        // [P] item → pair
  const int32_t* offset = nullptr;      // [E + 1] expert e owns items offset[e] .. offset[e+1]
  const int32_t* tile_expert = nullptr; // [max_tiles] (gmoe_tiles)
  const int32_t* tile_item = nullptr;   // [max_tiles] first item of the tile
  const int32_t* tile_count = nullptr;  // [1]
  /// Warps per CTA: 8 (default: the 64-item x ring shared by 256 weight rows) or 4 (the first
  /// version, 128 rows; A/B runs, env V4_GMOE_WARPS=4 through KernelContext::gmoe_warps).
  int warps = 8;
  /// The warpgroup-MMA kernel (default): the same CTA of 8 warps × 32 weight rows and 64 items,
  /// the products on wgmma.m64n64k16 (A = dequantized weight fragments in registers, B = the x
  /// tile in shared memory) instead of mma.sync; `warps` is not used. false: the mma.sync kernel
  /// (A/B runs: env V4_GMOE_WGMMA=0 through KernelContext::gmoe_wgmma).
  bool wgmma = true;
  /// Warpgroup-MMA kernel variant (A/B runs, session 18; bench/results/cuda-gmoe.md). 0
  /// (default): item columns N = 16 when the tile has ≤ 16 items, else 64; MXFP4 k-tiles without
  /// a block scale > 128 skip the second dequantization multiply (warp-uniform; the same bits);
  /// one wgmma commit group per logical k16 step. 1: as 0 with two step pairs dequantized in one
  /// burst and their four steps' wgmmas one commit group (faster at ≤ 256 tokens, 2% slower at
  /// 2,048). 2: as 0 with N = 64 always. 3: as 1 with N from {16, 32, 64}. 4: as 2 without the
  /// skip (the first form). Env V4_GMOE_WG_VARIANT through KernelContext::gmoe_wg_variant.
  int wg_variant = 0;
};

/// Whether the grouped GEMM can run `w` as an expert weight (K = w.k): FP8 with K % 128 == 0 or
/// MXFP4 with K % 256 == 0, 16-byte aligned data, 8-byte aligned scales.
bool gmoe_supported(const ops::WeightView& w);

/// Logical k position of stored column `col` of a K axis for a weight in format f (kFP8Block /
/// kMXFP4): the permutation inside each k-tile (wfrag::x_logical); identity for other formats.
int64_t gmoe_logical_col(ops::WFormat f, int64_t col);

/// Tile list from the routing: for every active expert (active[0 .. *active_count)), in that
/// order, tiles (e, offset[e] + 64·c) for c < ceil(count_e / 64); *tile_count = their number
/// (≤ gmoe_max_tiles). One warp, no sync.
Status gmoe_tiles(const int32_t* offset, const int32_t* active, const int32_t* active_count,
                  int32_t* tile_expert, int32_t* tile_item, int32_t* tile_count,
                  cudaStream_t stream);

/// xb[i, kt·KT + x_logical(q)] = bf16(x[list[i] / xdiv, kt·KT + q]) for i < min(P, *total),
/// K columns, k-tiles of format f (KT = 128 FP8 / 256 MXFP4). x: f32 rows of stride ldx,
/// 16-byte aligned, ldx % 4 == 0. Errors: kUnsupported for another format or K % KT != 0.
Status gmoe_gather(const float* x, int64_t ldx, int xdiv, const int32_t* list,
                   const int32_t* total, int64_t P, int64_t K, ops::WFormat f,
                   __nv_bfloat16* xb, cudaStream_t stream);

/// Runs the grouped GEMM over the tile list (grid: output tiles × max_tiles; CTAs past
/// *tile_count exit). No sync, no allocation (graph-capturable). Errors: kUnsupported when
/// !gmoe_supported(a.w), swiglu with an act_format k-tile not dividing n_out, or
/// max_tiles > 65535.
Status gmoe_mma(const GmoeArgs& a, int64_t max_tiles, cudaStream_t stream);

/// Sets the kernels' dynamic shared-memory limits (once per device, at backend creation).
Status gmoe_mma_prepare();

}  // namespace v4::cuda
