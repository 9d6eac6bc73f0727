// Batch-invariant f32 GEMM kernels of the CPU backend (see gemm.cpp for the summation order).
#pragma once
#include <cstdint>

namespace v4::ops::cpu {

/// True when the CPU supports AVX2 and FMA and V4_CPU_GEMM != "blas" (checked once).
bool have_avx2_fma();

/// y[i, j] = Σ_k x[i, k]·w[j, k] for i in [m0, m1), j in [n0, n1). x [M, K] (row stride ldx),
/// w [N, K] contiguous, y (row stride ldy). Each element's arithmetic is independent of the
/// tile/row range it is computed in. Requires have_avx2_fma().
void gemm_rows_avx2(const float* x, int64_t ldx, const float* w, int64_t m0, int64_t m1, int64_t n0,
                    int64_t n1, int64_t K, float* y, int64_t ldy);

}  // namespace v4::ops::cpu
