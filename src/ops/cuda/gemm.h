// Dense GEMMs of the CUDA backend through cuBLASLt.
// Layout convention (as nn.Linear): Y[M, N] = X[M, K] · W[N, K]ᵀ, all row-major, where M = tokens,
// K = input features, N = output features. Accumulation is fp32.
//
// Used by the bf16 precision mode's tensor-core paths (wgemm.h linear_w_bf16, moe.h): weights
// stored as bf16 are read in place; FP8 (128×128 block scales) and MXFP4 weights are dequantized
// to bf16 per call into scratch (one matrix or one expert). Native block-scaled FP8 GEMMs
// (cuBLASLt BLK128x128_32F / VEC128_32F scale modes) are future work (docs/cuda.md).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "base/status.h"

namespace v4::cuda {

/// Output element type of a GEMM.
enum class OutType { kF32, kBF16 };

/// A cuBLASLt handle with its workspace and a cache of chosen algorithms per shape.
/// Thread-compatible (one per stream/thread); the cache is internally locked.
class Gemm {
 public:
  /// Creates the handle and a device workspace of `workspace_bytes`.
  static Result<std::unique_ptr<Gemm>> create(size_t workspace_bytes = size_t(64) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// Y[M,N] = alpha · X[M,K] · W[N,K]ᵀ + beta · Y. X, W bf16; Y f32 or bf16 (`out`).
  /// Any M, N, K ≥ 1 (odd sizes fall back to slower kernels). Errors: kInvalidArgument for
  /// non-positive sizes, kUnsupported/kInternal from cuBLASLt.
  Status bf16(const __nv_bfloat16* X, const __nv_bfloat16* W, void* Y, OutType out, int64_t M,
              int64_t N, int64_t K, cudaStream_t stream, float alpha = 1.f, float beta = 0.f);
  /// As `bf16` with row strides (elements): X [M, K] stride ldx, W [N, K] stride ldw, Y [M, N]
  /// stride ldy (each ≥ its row length). Used for weight row slices and strided outputs.
  Status bf16_strided(const __nv_bfloat16* X, int64_t ldx, const __nv_bfloat16* W, int64_t ldw,
                      void* Y, int64_t ldy, OutType out, int64_t M, int64_t N, int64_t K,
                      cudaStream_t stream, float alpha = 1.f, float beta = 0.f);
  /// `batch` independent bf16_strided products in one cuBLASLt call (strided batch): product b
  /// reads X + b·sx, W + b·sw and writes Y + b·sy (strides in elements, ≥ 0). Used for grouped
  /// weights (the o-projection's wo_a groups) above the GEMV range. Errors as bf16_strided, and
  /// kInvalidArgument for batch < 1 or a negative stride.
  Status bf16_strided_batched(const __nv_bfloat16* X, int64_t ldx, int64_t sx,
                              const __nv_bfloat16* W, int64_t ldw, int64_t sw, void* Y,
                              int64_t ldy, int64_t sy, OutType out, int64_t M, int64_t N,
                              int64_t K, int batch, cudaStream_t stream);
  /// As `bf16_strided` with f32 X and W and f32 Y, computed in fp32 (CUBLAS_COMPUTE_32F: no TF32
  /// rounding). For f32-stored weights above the GEMV range (the MoE router at batch ≥ 9). Uses
  /// no workspace, so concurrent calls on different streams are safe.
  Status f32_strided(const float* X, int64_t ldx, const float* W, int64_t ldw, float* Y,
                     int64_t ldy, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

 private:
  Gemm() = default;
  struct Plan;
  // kind 0: bf16 X, W; kind 1: f32 X, W (Y f32).
  // batch > 1: strided batch with element strides sx (X), sw (W), sy (Y).
  Result<Plan*> plan(int kind, int64_t M, int64_t N, int64_t K, OutType out, int64_t ldx,
                     int64_t ldw, int64_t ldy, int align, int batch = 1, int64_t sx = 0,
                     int64_t sw = 0, int64_t sy = 0);
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::mutex mu_;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int, int,
                      int64_t, int64_t, int64_t>,
           std::unique_ptr<Plan>>
      plans_;
};

}  // namespace v4::cuda
