// Weight-format conversion on the device (run once at load; see docs/cuda.md).
// Formats (docs dsv4-model.md §11.2):
//   FP8: e4m3fn values Wq [N, K] (row-major, N = out features), ue8m0 scales [ceil(N/128),
//        ceil(K/128)], W[i,j] = fp8(Wq[i,j]) · 2^(s[i/128, j/128] − 127).
//   MXFP4: e2m1 nibbles packed two per byte, Wq [N, K/2] (low nibble = even column), ue8m0
//        scales [N, K/32], W[i,j] = e2m1(nib(i,j)) · 2^(s[i, j/32] − 127).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace v4::cuda {

/// FP8 e4m3 weight [N, K] with 128×128 ue8m0 block scales -> bf16 [N, K] (row-major).
/// Errors: kInvalidArgument for N, K < 1.
Status dequant_fp8_block_to_bf16(const uint8_t* wq, const uint8_t* scale_ue8m0, __nv_bfloat16* out,
                                 int64_t N, int64_t K, cudaStream_t stream);

/// MXFP4 weight [N, K] (packed [N, K/2], scales [N, K/32]) -> bf16 [N, K].
/// Errors: kInvalidArgument unless K is a positive multiple of 32.
Status dequant_mxfp4_to_bf16(const uint8_t* wq, const uint8_t* scale_ue8m0, __nv_bfloat16* out,
                             int64_t N, int64_t K, cudaStream_t stream);

/// f32 [n] -> bf16 [n] (round to nearest even).
Status f32_to_bf16(const float* in, __nv_bfloat16* out, int64_t n, cudaStream_t stream);
/// bf16 [n] -> f32 [n] (exact).
Status bf16_to_f32(const __nv_bfloat16* in, float* out, int64_t n, cudaStream_t stream);

}  // namespace v4::cuda
