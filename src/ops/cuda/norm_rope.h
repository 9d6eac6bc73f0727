// RMSNorm and interleaved partial RoPE on the device (docs dsv4-model.md §2, §4, pitfalls
// P1/P3/P18). T is float or __nv_bfloat16; all math in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace v4::cuda {

/// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) ⊙ weight   (weight [D] f32; nullptr = none).
/// x, out [rows, D] row-major (may alias). Used for all RMSNorms incl. the per-head q norm
/// (rows = S·H, D = hd, weight nullptr). Errors: kInvalidArgument for D < 1.
template <typename T>
Status rmsnorm(const T* x, const float* weight, T* out, int64_t rows, int64_t D, float eps,
               cudaStream_t stream);

/// In-place interleaved RoPE on the trailing `rd` channels of every head:
/// x [rows, n_heads, head_dim] with row stride `row_stride` elements (≥ n_heads·head_dim);
/// pair (2i, 2i+1) of the rope slice rotates by φ = fp32(inv_freq[i]) · fp32(pos[r]) —
/// (a, b) -> (a cosφ − b sinφ, a sinφ + b cosφ); `inverse` rotates by −φ (output de-rotation).
/// inv_freq [rd/2] f32 (default or YaRN table, built by the model), pos [rows] int64;
/// cos/sin are multiplied by `attention_scaling` (1 for V4 configs, see dsv4-model.md §1.4).
/// Errors: kInvalidArgument unless 0 < rd ≤ head_dim and rd even.
template <typename T>
Status rope_interleaved(T* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                        int64_t n_heads, int64_t head_dim, int64_t rd, int64_t row_stride,
                        bool inverse, cudaStream_t stream, float attention_scaling = 1.f);

/// Per-head RMSNorm then (forward) RoPE in one launch, in place, fp32: for every row r and head h
/// of x [rows, n_heads, head_dim] (contiguous), v = x[r, h] / sqrt(mean(x[r, h]²) + eps) ⊙ weight
/// (weight [head_dim] or nullptr), then the trailing rd channels rotate as rope_interleaved (same
/// angle and sincosf). One warp per head vector (8 per block); the sum of squares is a fixed
/// per-lane chain + warp tree, so rows are batch-invariant. Errors: kInvalidArgument unless
/// 0 < rd ≤ head_dim, rd even, head_dim − rd even.
Status rmsnorm_rope(float* x, const float* weight, const int64_t* pos, const float* inv_freq,
                    int64_t rows, int64_t n_heads, int64_t head_dim, int64_t rd, float eps,
                    float attention_scaling, cudaStream_t stream);

/// rmsnorm_rope with an explicit kernel (tests, A/B): `variant` 1 = the per-channel-group load
/// chain (what rmsnorm_rope runs by default), 2 = the register kernel (head_dim ≤ 512: all of a
/// lane's loads issued before the math; what rmsnorm_rope runs with V4_NORM_ROPE_REGS=1). Both
/// give the same bits. Errors: as rmsnorm_rope; variant 2 with head_dim > 512.
Status rmsnorm_rope_variant(float* x, const float* weight, const int64_t* pos,
                            const float* inv_freq, int64_t rows, int64_t n_heads, int64_t head_dim,
                            int64_t rd, float eps, float attention_scaling, int variant,
                            cudaStream_t stream);

}  // namespace v4::cuda
