// Dense weight GEMM on tensor cores for decode batches (bf16 precision mode):
//   y[m, n] = x[m, :] · dequant(W)[n, :]   for m < M, n < N (f32 in and out)
// over FP8 (128×128 blocks) or MXFP4 weights in their stored bytes, for 32 < M ≤ 256 rows — the
// range where the weight-streaming GEMV is FMA-bound and dequantize-to-scratch + cuBLASLt moves
// ~5 bytes per FP8 weight. The weight rows are the mma M side (two m16 tiles per warp, built in
// registers from each lane's own 16-byte chunks, as moe_mma), up to 64 x rows the N side (bf16,
// staged per k-tile through a CTA-wide cp.async ring), fp32 accumulation; K is split over CTAs
// when the N tiles alone do not fill the GPU, the partial sums added in split order by a second
// kernel (deterministic). x is rounded to bf16 (the tensor-core tolerance class).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "ops/cuda/wgemm.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Whether dense_mma can run view `w` with M rows of x (stride ldx) : FP8 with K % 128 == 0 or
/// MXFP4 with K % 256 == 0, 16-byte aligned weight rows, 8-byte aligned scales, x 16-byte
/// aligned with K % 4 == 0 and ldx % 4 == 0, 1 ≤ M ≤ kDenseMmaMaxRows.
bool dense_mma_supported(const ops::WeightView& w, const float* x, int64_t ldx, int64_t M);
constexpr int64_t kDenseMmaMaxRows = 256;

/// Scratch bytes per slot dense_mma needs for M rows of an [n, K] view (maxed into `bytes`):
/// kSlotXBf16 M·K·2 (x as bf16 in the fragment order), kSlotWBf16 the split-K partials.
void dense_mma_scratch_bytes(int64_t M, int64_t n, int64_t K, int num_sms, size_t* bytes);

/// y = x · dequant(W)ᵀ for M rows (expert 0 of `w`). No sync, no allocation beyond the context's
/// grow-only scratch (graph-capturable after one eager call). Errors: kUnsupported when
/// !dense_mma_supported.
Status dense_mma(const float* x, int64_t ldx, const ops::WeightView& w, int64_t M, float* y,
                 int64_t ldy, const KernelContext& c);

/// Sets the kernels' dynamic shared-memory limits (once per device, at backend creation).
Status dense_mma_prepare();

}  // namespace v4::cuda
