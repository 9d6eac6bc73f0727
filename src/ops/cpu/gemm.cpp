// Batch-invariant f32 GEMM for the CPU backend: y[i, j] = Σ_k x[i, k] · w[j, k].
//
// Every output element is computed by the same arithmetic sequence whatever the tile it falls
// in and whatever M is: 8 lane accumulators over k in steps of 8 (one FMA per lane and step, in
// k order), a fixed horizontal sum ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then the K % 8 tail with
// scalar FMAs in k order. Tiles of 4 rows × 3 columns only reuse loads; they do not change the
// per-element sequence. So a row's result depends only on x[row], w, K — not on the batch.
// Used when the CPU has AVX2 + FMA; otherwise cpu_ops.cpp falls back to fixed-block cblas.
#include "ops/cpu/gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace v4::ops::cpu {
namespace {

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);          // l0 l1 l2 l3
  const __m128 hi = _mm256_extractf128_ps(v, 1);        // l4 l5 l6 l7
  const __m128 s = _mm_add_ps(lo, hi);                  // (l0+l4) (l1+l5) (l2+l6) (l3+l7)
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  const __m128 u = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
  return _mm_cvtss_f32(u);
}

// R rows × C columns tile; R ≤ 4, C ≤ 3 (register budget: 12 accumulators + 3 x + 1 w).
template <int R, int C>
__attribute__((target("avx2,fma"))) void tile(const float* x, int64_t ldx, const float* w,
                                              int64_t K, float* y, int64_t ldy) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * ldx + k);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_loadu_ps(w + c * K + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t k = K8; k < K; ++k) s = std::fma(x[r * ldx + k], w[c * K + k], s);
      y[r * ldy + c] = s;
    }
}

template <int R>
__attribute__((target("avx2,fma"))) void row_panel(const float* x, int64_t ldx, const float* w,
                                                   int64_t n0, int64_t n1, int64_t K, float* y,
                                                   int64_t ldy) {
  int64_t j = n0;
  for (; j + 3 <= n1; j += 3) tile<R, 3>(x, ldx, w + j * K, K, y + j, ldy);
  for (; j < n1; ++j) tile<R, 1>(x, ldx, w + j * K, K, y + j, ldy);
}

}  // namespace

bool have_avx2_fma() {
  // V4_CPU_GEMM=blas forces the fixed-block cblas path (to test it on AVX2 machines).
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      !(std::getenv("V4_CPU_GEMM") && std::string(std::getenv("V4_CPU_GEMM")) == "blas");
  return ok;
}

void gemm_rows_avx2(const float* x, int64_t ldx, const float* w, int64_t m0, int64_t m1, int64_t n0,
                    int64_t n1, int64_t K, float* y, int64_t ldy) {
  int64_t i = m0;
  for (; i + 4 <= m1; i += 4) row_panel<4>(x + i * ldx, ldx, w, n0, n1, K, y + i * ldy, ldy);
  for (; i < m1; ++i) row_panel<1>(x + i * ldx, ldx, w, n0, n1, K, y + i * ldy, ldy);
}

}  // namespace v4::ops::cpu
