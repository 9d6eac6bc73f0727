// Streaming GEMV (bf16 mode's decode linears, issue 7): the weight bytes of a few rows of x
// (M ≤ 4 per pass) are streamed once from HBM with 16-byte non-L1-allocating loads, x is read
// straight from global memory (L1-resident, no shared-memory staging), fp32 math on the exactly
// dequantized weights (same tolerance class as wgemv: ≤ 1e-5 of max |y|, batch-invariant).
//
// Layout: a block of 8 warps; each warp owns 4 weight rows (4 outputs, or the gate and up rows of
// 2 outputs with SwiGLU) and one of `ks` K-slices (ks ∈ {1, 2, 4, 8} warps per row group, chosen
// from (n_out, K, grid_y, SMs) only, never from M). A "chunk" is 32 lanes × 16 bytes of one row;
// chunk c goes to K-slice c % ks; a warp issues the loads of 2 of its chunks × 4 rows (8 × 16 B
// per lane) before any math. Per output: every lane sums its chunks in increasing c (FP8 / MXFP4
// scaled once per chunk), a fixed butterfly over lanes, then the K-slices in slice order through
// shared memory. Grid: with 1 … 4 waves of tiles of outputs (GemvArgs::persist, the default),
// about one wave of blocks (resident blocks per SM × SMs), block b taking tiles b, b + gridDim.x,
// ... in equal shares (no block-launch gaps and tail between tiles: wq_b 21.4 → 18.4 µs, wo_a
// 23.3 → 19.9 on the H200, bench/results/cuda-gemv-s27.md); otherwise one block per tile. A
// warp's loads of a batch are all issued before its math (a register double buffer across
// batches was measured slower: spills at the 128-register cap). More rows than a pass (MT = 1, 2
// or 4 rows of x; MXFP4 ≤ 2) run further passes over the same weights, spread over grid.z while
// the grid is smaller than 4 blocks per SM (plain forms only).
#pragma once
#include <cuda_runtime.h>

#include "base/status.h"
#include "ops/cuda/wgemm.h"

namespace v4::cuda {

/// Whether gemv_stream can run `a` (all forms of GemvArgs): 16-byte aligned weight rows
/// (wrow_bytes(K) % 16 == 0, 16-byte aligned data) and 16-byte aligned x rows (x, ldx and
/// x_group_stride multiples of 4 floats). Host-side; no device access.
bool gemv_stream_supported(const GemvArgs& a);

/// Warps per row group splitting K that gemv_stream uses for these arguments (1, 2, 4 or 8): a
/// function of (n_out, K, format, swiglu, grid_y, num_sms) only. Exposed for tests and benches.
int gemv_stream_kslices(const GemvArgs& a, int grid_y, int num_sms);

/// Runs the streaming GEMV over grid_y group / expert slots (GemvArgs: plain, grouped-plain and
/// grouped-by-expert forms, optional SwiGLU). Errors: kUnsupported when !gemv_stream_supported(a)
/// (wgemv then runs its shared-memory kernel), kInvalidArgument for a bad view.
Status gemv_stream(GemvArgs a, int grid_y, int num_sms, cudaStream_t stream);

/// Whether wgemv may take gemv_stream: false when the environment sets V4_GEMV_STREAM=0
/// (process-wide A/B switch, read once); otherwise true.
bool gemv_stream_env_enabled();

}  // namespace v4::cuda
