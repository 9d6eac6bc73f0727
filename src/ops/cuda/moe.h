// MoE experts of the CUDA backend (ops::Ops::moe_experts, dsv4-model.md §8) over native weight
// formats, in the two precision modes of cuda_ops.h:
//   moe_fp32  reference: one warp per output dot product (fixed order), dequantizing on the fly.
//   moe_bf16  speed:
//     - decode-sized calls (S·k < sync_min_pairs): (token, slot) pairs are routed to experts on
//       the device (counts, offsets, active-expert list, pair lists; no host sync), then a grouped
//       GEMV (wgemv over active experts × output tiles, every active expert's native weights read
//       once for all its pairs, fp32 math) computes gate/up with the SwiGLU clamp fused, a second
//       grouped GEMV the down projection per pair, and a combine sums the pairs of a token in
//       j order. No allocation, no sync: graph-capturable.
//       With FP8 / MXFP4 routed experts (E > 1) the two grouped GEMVs are replaced by the
//       tensor-core grouped GEMM of moe_mma.h (CudaOptions::moe_mma, default on): x and the
//       SwiGLU output rounded to bf16, bf16 mma with fp32 accumulation.
//     - the shared-expert form (E = 1) with more than gemv_max_rows rows: dense bf16 tensor-core
//       GEMMs (cuBLASLt) on a bf16 copy of the one expert (no sync).
//     - prefill-sized calls (S·k ≥ sync_min_pairs): with FP8 / MXFP4 routed experts (E > 1,
//       CudaOptions::moe_grouped_mma, default on) device routing + the grouped tensor-core GEMM of
//       gmoe_mma.h (64 items per CTA, no sync, graph-capturable; also for S ≥
//       KernelContext::grouped_min_rows below the threshold); otherwise the per-expert counts are
//       read back (one sync) and every active expert runs cuBLASLt GEMMs on a bf16 dequantized
//       copy of that expert.
// Every path writes per-(token, slot) results first and combines them in j order (deterministic).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/moe_mma.h"
#include "ops/cuda/wgemm.h"
#include "ops/ops.h"

namespace v4::cuda {

/// Scratch bytes per slot that moe_experts needs for S rows, D hidden, I inter, E experts, top-k
/// k in the given mode (the path the call takes), maxed into `bytes[kNumScratchSlots]`.
void moe_scratch_bytes(bool bf16, int64_t S, int D, int I, int E, int k, const KernelContext& c,
                       size_t* bytes);

/// fp32-mode moe_experts (reference).
Status moe_fp32(const ops::MoeArgs& a, const KernelContext& c);
/// bf16-mode moe_experts (see the file comment).
Status moe_bf16(const ops::MoeArgs& a, const KernelContext& c);

/// Whether a bf16-mode moe_experts call with these operands runs on tensor cores (moe_mma,
/// the dense shared-expert GEMMs or the prefill cuBLASLt path) rather than fp32-math GEMVs —
/// tests pick their tolerance with it. x_aligned: x is 16-byte aligned with hidden % 4 == 0.
bool moe_bf16_uses_tensor_cores(const ops::WeightView& w13, const ops::WeightView& w2, int64_t S,
                                int E, int k, bool x_aligned, const KernelContext& c);

}  // namespace v4::cuda
